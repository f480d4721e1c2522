#!/usr/bin/env bash
# Bring up a REAL two-node Slurm cluster on this one machine, for the multi-node tests
# (nodes_per_job: 2): a slurmctld and two slurmd daemons, the second in a network namespace of its
# own, so that the two "nodes" have their own addresses and ports and the job's ranks meet over a
# real (virtual) network, as on a cluster.
#
#   sudo ./start-two-node-slurm.sh            # idempotent
#   sudo ./stop-two-node-slurm.sh             # stops exactly what was started here
#
# Needs: root, Slurm's daemons (start-local-slurm.sh installs them, and the munged it starts is
# shared), iproute2. Clients reach this cluster with SLURM_CONF=$STATE_DIR/slurm.conf; the one-node
# cluster of start-local-slurm.sh (ports 6817/6818) is left alone.
#
# What you get:
#   * nodes tlnode1 (10.231.0.1, this namespace) and tlnode2 (10.231.0.2, namespace tl-node2),
#     joined by a veth pair named tl0 on both sides, each with CPUS cores (default 1) and MEMORY_MB;
#   * /etc/hosts lines for both names (tagged, removed by the stop script);
#   * partition "two" (both nodes), no accounting (status through squeue);
#   * slurmctld on port 7817, slurmd on port 7818 in each namespace.
# Ranks of a job should use GLOO_SOCKET_IFNAME=tl0 (gloo's address on each node).
set -euo pipefail

STATE_DIR="${TWO_NODE_STATE_DIR:-/run/two-node-slurm}"
CPUS="${TWO_NODE_CPUS:-1}"
MEMORY_MB="${TWO_NODE_MEMORY_MB:-2000}"
NETNS=tl-node2
CONF="$STATE_DIR/slurm.conf"
PIDS="$STATE_DIR/pids"
T0=$(date +%s)

log() { printf '[start-two-node-slurm %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { log "ERROR: $*"; exit 1; }
wait_for() {
  local t="$1" what="$2"; shift 2
  for ((i = 0; i < t * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  log "timed out after ${t}s waiting for: $what"
  return 1
}

[[ $(id -u) -eq 0 ]] || die "needs root"
command -v slurmctld >/dev/null && command -v slurmd >/dev/null || die "Slurm's daemons are not installed (start-local-slurm.sh installs them)"
command -v ip >/dev/null || die "iproute2 (ip) is not installed"
[[ -S /run/munge/munge.socket.2 ]] || die "munged is not running (start-local-slurm.sh starts it)"

if SLURM_CONF="$CONF" scontrol ping >/dev/null 2>&1 \
  && [[ $(SLURM_CONF="$CONF" sinfo -h -o '%t' -p two 2>/dev/null | sort -u) == idle ]]; then
  log "already up"
  exit 0
fi

mkdir -p "$STATE_DIR"/{ctld,spool-tlnode1,spool-tlnode2,log}
chown -R slurm: "$STATE_DIR/ctld" "$STATE_DIR/log" 2>/dev/null || true

# --- the network: a veth pair tl0 <-> tl0 (in the namespace), 10.231.0.0/24 ---------------------
if ! ip netns list | grep -qw "$NETNS"; then
  ip netns add "$NETNS"
fi
if ! ip link show tl0 >/dev/null 2>&1; then
  ip link add tl0 type veth peer name tl0peer
  ip link set tl0peer netns "$NETNS"
  ip netns exec "$NETNS" ip link set tl0peer name tl0
fi
ip addr replace 10.231.0.1/24 dev tl0
ip link set tl0 up
ip netns exec "$NETNS" ip addr replace 10.231.0.2/24 dev tl0
ip netns exec "$NETNS" ip link set tl0 up
ip netns exec "$NETNS" ip link set lo up
if ! grep -q "# two-node-slurm" /etc/hosts; then
  printf '10.231.0.1 tlnode1 # two-node-slurm\n10.231.0.2 tlnode2 # two-node-slurm\n' >> /etc/hosts
fi

# --- the configuration ---------------------------------------------------------------------------
cat > "$CONF" <<EOF
ClusterName=twonode
SlurmctldHost=$(hostname -s)(10.231.0.1)
SlurmctldPort=7817
SlurmdPort=7818
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=300
SlurmdParameters=config_overrides
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool-%n
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd-%n.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd-%n.log
NodeName=tlnode1 NodeAddr=10.231.0.1 CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
NodeName=tlnode2 NodeAddr=10.231.0.2 CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=two Nodes=tlnode1,tlnode2 Default=YES MaxTime=1-00:00:00 State=UP
EOF

# --- the daemons ---------------------------------------------------------------------------------
# on_node NAME: start NAME's slurmd as a node of a cluster would run it. In a UTS namespace whose
# hostname is NAME (torchrun's rendezvous recognises the node it hosts by its hostname), and in a
# mount namespace where /etc/slurm/slurm.conf is this cluster's: its jobs' own srun and scontrol
# read the default path (Snakemake's job steps drop SLURM_CONF from their environment).
on_node() {
  unshare --mount --uts bash -c "mount --bind '$CONF' /etc/slurm/slurm.conf && hostname '$1' && exec slurmd -f '$CONF' -N '$1'"
}
mkdir -p /etc/slurm && touch /etc/slurm/slurm.conf  # a mount point, when no one-node cluster is there
: >> "$PIDS"
if ! SLURM_CONF="$CONF" scontrol ping >/dev/null 2>&1; then
  SLURM_CONF="$CONF" slurmctld -f "$CONF" -i
  wait_for 20 "slurmctld" env SLURM_CONF="$CONF" scontrol ping || die "slurmctld did not answer (see $STATE_DIR/log)"
  echo "slurmctld $(cat "$STATE_DIR/slurmctld.pid")" >> "$PIDS"
fi
if [[ ! -s "$STATE_DIR/slurmd-tlnode1.pid" ]] || ! kill -0 "$(cat "$STATE_DIR/slurmd-tlnode1.pid")" 2>/dev/null; then
  on_node tlnode1
  wait_for 10 "slurmd tlnode1" test -s "$STATE_DIR/slurmd-tlnode1.pid"
  echo "slurmd-tlnode1 $(cat "$STATE_DIR/slurmd-tlnode1.pid")" >> "$PIDS"
fi
if [[ ! -s "$STATE_DIR/slurmd-tlnode2.pid" ]] || ! kill -0 "$(cat "$STATE_DIR/slurmd-tlnode2.pid")" 2>/dev/null; then
  # its network only (ip netns exec would also remount /sys, where slurmd finds its cgroups)
  nsenter --net="/run/netns/$NETNS" bash -c "$(declare -f on_node); CONF='$CONF' on_node tlnode2"
  wait_for 10 "slurmd tlnode2" test -s "$STATE_DIR/slurmd-tlnode2.pid"
  echo "slurmd-tlnode2 $(cat "$STATE_DIR/slurmd-tlnode2.pid")" >> "$PIDS"
fi
for node in tlnode1 tlnode2; do
  SLURM_CONF="$CONF" scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
done
wait_for 30 "both nodes idle" bash -c "[[ \$(SLURM_CONF='$CONF' sinfo -h -o '%t' -p two | sort -u) == idle ]]" \
  || die "the nodes did not come up: $(SLURM_CONF="$CONF" sinfo -N -p two 2>&1 | tr '\n' ' ')"
out=$(SLURM_CONF="$CONF" srun -p two -N 2 --ntasks-per-node 1 -t 1 hostname -I 2>&1 | sort | tr '\n' ' ') \
  || die "a two-node step failed: $out"
log "up: two nodes answer ($out); SLURM_CONF=$CONF"
