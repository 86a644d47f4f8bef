#!/usr/bin/env bash
# Start a Ray head plus N worker nodes on this one machine (for testing multi-node behaviour):
#   bash cluster/local_cluster.sh start 2      # head (0 CPUs for trials) + 2 workers x 1 CPU
#   archsearch search search_spaces/default.yaml --address 127.0.0.1:6380
#   archsearch submit search_spaces/default.yaml --address http://127.0.0.1:8265 --storage "$PWD/runs"
#   bash cluster/local_cluster.sh stop      # `ray stop`: stops EVERY Ray on this machine
# Each worker is a separate raylet, so killing one (its `raylet` process: `pgrep -a raylet`)
# behaves like losing a node.
set -euo pipefail
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" RAY_USAGE_STATS_ENABLED=0
PORT="${RAY_PORT:-6380}"
CPUS_PER_WORKER="${CPUS_PER_WORKER:-1}"
case "${1:-}" in
  start)
    n="${2:-2}"
    ray start --head --port="$PORT" --num-cpus=0 --dashboard-host=127.0.0.1 --disable-usage-stats
    for i in $(seq 1 "$n"); do
      ray start --address="127.0.0.1:$PORT" --num-cpus="$CPUS_PER_WORKER" --disable-usage-stats
    done
    echo "cluster up: archsearch search SPACE --address 127.0.0.1:$PORT"
    echo "        or: archsearch submit SPACE --address http://127.0.0.1:8265 --storage $PWD/runs" ;;
  stop)
    ray stop --force ;;
  *)
    echo "usage: $0 start [N] | stop" >&2; exit 2 ;;
esac
