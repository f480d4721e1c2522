#!/usr/bin/env bash
# Bring up a REAL one-node Slurm cluster (Debian 12's Slurm 22.05) on this
# machine, for CI tests of a Snakemake Slurm profile.
#
#   sudo ./start-local-slurm.sh            # idempotent: safe to run again
#   sudo ./stop-local-slurm.sh [--purge]   # stops exactly the PIDs started here
#
# Needs: root, Debian 12 (bookworm), apt access to the Debian archive. No
# systemd, no cgroups and no real GPU needed (works in containers/microVMs).
#
# What you get:
#   * munged, slurmctld, slurmd (node "localhost", all CPUs, ~90% of RAM, or the
#     shape given by SLURM_LOCAL_CPUS / SLURM_LOCAL_MEMORY_MB)
#   * partition  $SLURM_LOCAL_PARTITION (default "gpu", Default=YES, MaxTime 3 days)
#   * fake GPUs  $SLURM_LOCAL_GPUS x gpu:$SLURM_LOCAL_GPU_TYPE (GRES backed by
#     char devices that behave like /dev/null; jobs get CUDA_VISIBLE_DEVICES)
#   * with SLURM_LOCAL_ACCOUNTING=1 (default): MariaDB + slurmdbd, so sacct,
#     sacctmgr and sshare work, the account $SLURM_LOCAL_ACCOUNT exists and is
#     ENFORCED (AccountingStorageEnforce=associations,limits), like on a real site.
#   * with SLURM_LOCAL_ACCOUNTING=0: no database; sacct/sacctmgr fail, so the
#     Snakemake plugin must run with  slurm-status-command: squeue  and without
#     slurm_account (see the project README, "Cluster").
#
# PIDs of every daemon started here are appended to $STATE_DIR/pids
# ("name pid" per line); stop-local-slurm.sh kills only those PIDs.
set -euo pipefail

# ---------------------------------------------------------------- settings
ACCOUNTING="${SLURM_LOCAL_ACCOUNTING:-1}"
ACCOUNT="${SLURM_LOCAL_ACCOUNT:-naiss2026-3-205-gpu}"
PARTITION="${SLURM_LOCAL_PARTITION:-gpu}"
CLUSTER="${SLURM_LOCAL_CLUSTER:-localcluster}"
GPUS="${SLURM_LOCAL_GPUS:-4}"                 # fake GPUs; 0 = no GRES at all
GPU_TYPE="${SLURM_LOCAL_GPU_TYPE:-gh200}"
MAX_TIME="${SLURM_LOCAL_MAX_TIME:-3-00:00:00}"
EXTRA_USERS="${SLURM_LOCAL_USERS:-}"          # more users to add to $ACCOUNT
SKIP_APT="${SLURM_LOCAL_SKIP_APT:-0}"
SMOKE_TEST="${SLURM_LOCAL_SMOKE_TEST:-1}"
STATE_DIR="${SLURM_LOCAL_STATE_DIR:-/run/local-slurm}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE="$HERE/slurm.conf.template"
PIDS="$STATE_DIR/pids"
T0=$(date +%s)

log() { printf '[start-local-slurm %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { log "ERROR: $*"; exit 1; }

# wait_for <seconds> <description> <command...>
wait_for() {
  local t="$1" what="$2"; shift 2
  local i
  for ((i = 0; i < t * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  log "timed out after ${t}s waiting for: $what"
  return 1
}

# alive <pidfile> <comm>: the pid in pidfile runs a process named comm
alive() {
  local pid
  [[ -s "$1" ]] || return 1
  pid="$(tr -d '[:space:]' < "$1")"
  [[ -n "$pid" && -r "/proc/$pid/comm" ]] || return 1
  [[ "$(cat "/proc/$pid/comm")" == "$2" ]]
}

record_pid() { echo "$1 $2" >> "$PIDS"; log "started $1 (pid $2)"; }

[[ $EUID -eq 0 ]] || die "run as root"
[[ -f "$TEMPLATE" ]] || die "missing $TEMPLATE"
if ! grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  log "warning: not Debian 12 (bookworm); continuing anyway"
fi
mkdir -p "$STATE_DIR"
touch "$PIDS"

# ---------------------------------------------------------------- packages
PKGS=(slurm-wlm munge)
[[ "$ACCOUNTING" == 1 ]] && PKGS+=(slurmdbd mariadb-server)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  [[ "$SKIP_APT" == 1 ]] && die "packages missing and SLURM_LOCAL_SKIP_APT=1: ${missing[*]}"
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # --no-install-recommends keeps it small; slurm-wlm still pulls slurmctld,
  # slurmd, slurm-client and the basic plugins.
fi
log "packages: $(dpkg-query -W -f='${Package} ${Version}\n' slurmctld munge 2>/dev/null | tr '\n' ' ')"

# ---------------------------------------------------------------- munge
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  log "creating munge key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile=/etc/munge/munge.key
  else
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "munged already running"
else
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 "munged" bash -c 'munge -n | unmunge' || die "munged did not start"
  record_pid munged "$(cat /run/munge/munged.pid)"
fi

# ---------------------------------------------------------------- slurm dirs
install -d -o slurm -g slurm -m 0755 /var/spool/slurmctld /var/log/slurm
install -d -m 0755 /var/spool/slurmd /etc/slurm

# ---------------------------------------------------------------- config
# Node shape. Defaults: the real machine. SLURM_LOCAL_CPUS / SLURM_LOCAL_MEMORY_MB
# may claim MORE than exists (SlurmdParameters=config_overrides, no cgroups), e.g.
# 288 CPUs / 800000 MB to mimic a 4 x GH200 node so a production profile's
# requests fit; jobs then simply share the real cores.
MEM_MB="$(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo)"
CPUS="${SLURM_LOCAL_CPUS:-$(nproc)}"
REAL_MEMORY="${SLURM_LOCAL_MEMORY_MB:-$(( MEM_MB * 9 / 10 ))}"   # default leaves 10% for the OS

NODE_GRES=""
if (( GPUS > 0 )); then
  NODE_GRES="Gres=gpu:${GPU_TYPE}:${GPUS}"
  # Slurm drops file-less GPUs ("Removing file-less GPU"), so give each fake
  # GPU a char device with /dev/null's numbers (1,3): harmless to open.
  for ((i = 0; i < GPUS; i++)); do
    [[ -c /dev/fakegpu$i ]] || mknod -m 0666 "/dev/fakegpu$i" c 1 3
  done
  GRES_CONF=$'AutoDetect=off\n'"NodeName=localhost Name=gpu Type=${GPU_TYPE} File=/dev/fakegpu[0-$((GPUS - 1))]"$'\n'
else
  GRES_CONF=$'AutoDetect=off\n'
fi

if [[ "$ACCOUNTING" == 1 ]]; then
  ACCOUNTING_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageEnforce=associations,limits
AccountingStorageTRES=gres/gpu"
else
  ACCOUNTING_LINES="AccountingStorageType=accounting_storage/none"
fi

conf="$(cat "$TEMPLATE")"
conf="${conf//@CLUSTER@/$CLUSTER}"
conf="${conf//@CPUS@/$CPUS}"
conf="${conf//@REAL_MEMORY@/$REAL_MEMORY}"
conf="${conf//@NODE_GRES@/$NODE_GRES}"
conf="${conf//@PARTITION@/$PARTITION}"
conf="${conf//@MAX_TIME@/$MAX_TIME}"
conf="${conf//@ACCOUNTING_LINES@/$ACCOUNTING_LINES}"

CONF_CHANGED=0
if [[ "$conf"$'\n' != "$(cat /etc/slurm/slurm.conf 2>/dev/null)"$'\n' ]]; then
  printf '%s\n' "$conf" > /etc/slurm/slurm.conf
  CONF_CHANGED=1
fi
if [[ "$GRES_CONF" != "$(cat /etc/slurm/gres.conf 2>/dev/null)"$'\n' ]]; then
  printf '%s' "$GRES_CONF" > /etc/slurm/gres.conf
  CONF_CHANGED=1
fi
chmod 0644 /etc/slurm/slurm.conf /etc/slurm/gres.conf
log "slurm.conf: CPUs=$CPUS RealMemory=$REAL_MEMORY ${NODE_GRES:-no GRES} partition=$PARTITION accounting=$ACCOUNTING (changed=$CONF_CHANGED)"

stop_pidfile() {  # stop a daemon we are about to restart because config changed
  local pid; pid="$(tr -d '[:space:]' < "$1")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do [[ -d /proc/$pid ]] || return 0; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
}
if (( CONF_CHANGED )); then
  alive /run/slurmd.pid slurmd && { log "config changed: restarting slurmd"; stop_pidfile /run/slurmd.pid; }
  alive /run/slurmctld.pid slurmctld && { log "config changed: restarting slurmctld"; stop_pidfile /run/slurmctld.pid; }
fi

# ---------------------------------------------------------------- accounting
if [[ "$ACCOUNTING" == 1 ]]; then
  install -d -o mysql -g mysql -m 0755 /run/mysqld
  if mysqladmin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1; then
    log "mariadb already running"
  else
    if [[ ! -d /var/lib/mysql/mysql ]]; then
      log "initialising MariaDB data dir"
      mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    setsid nohup /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 \
      --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mysqld.pid \
      > /var/log/slurm/mariadbd-local.log 2>&1 < /dev/null &
    record_pid mariadbd "$!"
    wait_for 60 "mariadb" mysqladmin --socket=/run/mysqld/mysqld.sock ping \
      || die "mariadb did not start, see /var/log/slurm/mariadbd-local.log"
  fi

  # keep the slurmdbd DB password stable across runs
  DB_PASS="$(sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf 2>/dev/null || true)"
  [[ -n "$DB_PASS" ]] || DB_PASS="$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')"
  mysql --socket=/run/mysqld/mysqld.sock <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${DB_PASS}';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${DB_PASS}';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL
  cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=slurm
StoragePass=${DB_PASS}
StorageLoc=slurm_acct_db
EOF
  chown slurm:slurm /etc/slurm/slurmdbd.conf
  chmod 0600 /etc/slurm/slurmdbd.conf

  if alive /run/slurmdbd.pid slurmdbd; then
    log "slurmdbd already running"
  else
    /usr/sbin/slurmdbd
    wait_for 60 "slurmdbd" sacctmgr -n list cluster || die "slurmdbd did not start, see /var/log/slurm/slurmdbd.log"
    record_pid slurmdbd "$(cat /run/slurmdbd.pid)"
  fi
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
    log "registered cluster $CLUSTER"
  fi
  if ! sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT"; then
    sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=local-test Organization=local >/dev/null
    log "created account $ACCOUNT"
  fi
  for u in root $EXTRA_USERS; do
    id "$u" >/dev/null 2>&1 || { log "warning: no such user $u"; continue; }
    if ! sacctmgr -n -P list assoc cluster="$CLUSTER" account="$ACCOUNT" user="$u" format=user | grep -qx "$u"; then
      sacctmgr -i add user "$u" Account="$ACCOUNT" DefaultAccount="$ACCOUNT" Cluster="$CLUSTER" >/dev/null
      log "added user $u to $ACCOUNT"
    fi
  done
fi

# ---------------------------------------------------------------- slurmctld / slurmd
if alive /run/slurmctld.pid slurmctld; then
  log "slurmctld already running"
else
  /usr/sbin/slurmctld
  wait_for 30 "slurmctld" scontrol ping || die "slurmctld did not start, see /var/log/slurm/slurmctld.log"
  record_pid slurmctld "$(cat /run/slurmctld.pid)"
fi
if alive /run/slurmd.pid slurmd; then
  log "slurmd already running"
else
  /usr/sbin/slurmd -N localhost
  wait_for 15 "slurmd pid file" test -s /run/slurmd.pid || die "slurmd did not start, see /var/log/slurm/slurmd.log"
  record_pid slurmd "$(cat /run/slurmd.pid)"
fi

node_state() { sinfo -h -n localhost -o '%T' 2>/dev/null | head -1; }
wait_for 30 "node registration" bash -c "sinfo -h -n localhost -o '%T' | grep -qvE '^(unknown\\*?)?$'" || true
state="$(node_state)"
case "$state" in
  *drain*|*down*|*fail*)
    log "node state '$state': resuming"
    scontrol update nodename=localhost state=resume || true ;;
  *inval*)
    die "node state INVAL (config does not match hardware), see /var/log/slurm/slurmctld.log" ;;
esac
wait_for 30 "node idle/usable" bash -c "sinfo -h -n localhost -o '%T' | grep -qE '^(idle|mixed|allocated|completing)'" \
  || die "node not usable: $(node_state); see /var/log/slurm/slurmctld.log"
log "node: $(sinfo -h -n localhost -o '%P %T cpus=%c mem=%m gres=%G')"

# ---------------------------------------------------------------- smoke test
if [[ "$SMOKE_TEST" == 1 ]]; then
  args=(-p "$PARTITION" -t 1 -N 1)
  [[ "$ACCOUNTING" == 1 ]] && args+=(-A "$ACCOUNT")
  (( GPUS > 0 )) && args+=(--gpus=1)
  # shellcheck disable=SC2016  # expanded inside the job
  out="$(cd /tmp && timeout 120 srun "${args[@]}" bash -c 'echo "ok job=$SLURM_JOB_ID gpus=${CUDA_VISIBLE_DEVICES:-none}"')" \
    || die "smoke test 'srun ${args[*]}' failed"
  log "smoke test: srun ${args[*]} -> $out"
fi

log "ready in $(( $(date +%s) - T0 ))s  (pids recorded in $PIDS; stop with $HERE/stop-local-slurm.sh)"
