#!/usr/bin/env bash
# Stop what start-two-node-slurm.sh started: its daemons (by the PIDs it recorded), the network
# namespace and veth pair, and its /etc/hosts lines. The one-node cluster is left alone.
set -uo pipefail

STATE_DIR="${TWO_NODE_STATE_DIR:-/run/two-node-slurm}"
PIDS="$STATE_DIR/pids"

if [[ -f "$PIDS" ]]; then
  while read -r name pid; do
    kill "$pid" 2>/dev/null && echo "[stop-two-node-slurm] stopped $name ($pid)"
  done < "$PIDS"
  sleep 1
  while read -r _ pid; do kill -9 "$pid" 2>/dev/null; done < "$PIDS"
  rm -f "$PIDS"
fi
ip link del tl0 2>/dev/null
ip netns del tl-node2 2>/dev/null
if grep -q "# two-node-slurm" /etc/hosts; then
  grep -v "# two-node-slurm" /etc/hosts > /etc/hosts.two-node && cat /etc/hosts.two-node > /etc/hosts
  rm -f /etc/hosts.two-node
fi
rm -rf "$STATE_DIR"
exit 0
