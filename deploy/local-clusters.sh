#!/usr/bin/env bash
# Two more Ray clusters on this machine, "a" and "b", to try several clusters behind one control plane
# (issue 31, docs/clusters.md) with `make run`, whose own local cluster stays the default one. Each is a lone
# Ray head (deploy/local-cluster.sh with LOCAL_CLUSTER_HEAD_ONLY=1: no second node, database or control plane)
# with 1 CPU, its own token file and its own storage dir.
#
#   deploy/local-clusters.sh start    start both, then print the ORCHESTRATOR_CLUSTERS to export before `make run`
#   deploy/local-clusters.sh status   what runs, and that export line again (exit 1: neither runs)
#   deploy/local-clusters.sh stop     stop both; nothing is left running
#
# Ports (each overridable: LOCAL_CLUSTERS_A_GCS_PORT, ..._A_DASHBOARD_PORT, ..._A_CLIENT_PORT, ..._A_SERVE_PORT,
# the same for B), clear of `make run` (GCS 6390, dashboard 8265, client 10001, API 8000), deploy/local-cluster.sh
# (6391, 8266, 10000, 8010), Redis (6379), Ray Serve (8001) and Ray's worker ports (10002-19999):
#   a: GCS 6392, dashboard http://127.0.0.1:8267, client 9992, Serve http://127.0.0.1:8002 (its serve_port)
#   b: GCS 6393, dashboard http://127.0.0.1:8268, client 9993, Serve http://127.0.0.1:8003
# Other settings: LOCAL_CLUSTERS_DIR (default <repo>/var/local-clusters; cluster X's state dir is
# $LOCAL_CLUSTERS_DIR/X: its pids, logs, ray/auth_token and storage/), LOCAL_CLUSTERS_CPUS (default 1),
# LOCAL_CLUSTERS_BIN (default <repo>/.venv/bin).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ONE=$ROOT/deploy/local-cluster.sh
DIR=$(realpath -m "${LOCAL_CLUSTERS_DIR:-$ROOT/var/local-clusters}")
BIN=${LOCAL_CLUSTERS_BIN:-$ROOT/.venv/bin}
CLUSTERS=(a b)
declare -A GCS_PORT=([a]=${LOCAL_CLUSTERS_A_GCS_PORT:-6392} [b]=${LOCAL_CLUSTERS_B_GCS_PORT:-6393})
declare -A DASHBOARD_PORT=([a]=${LOCAL_CLUSTERS_A_DASHBOARD_PORT:-8267} [b]=${LOCAL_CLUSTERS_B_DASHBOARD_PORT:-8268})
declare -A CLIENT_PORT=([a]=${LOCAL_CLUSTERS_A_CLIENT_PORT:-9992} [b]=${LOCAL_CLUSTERS_B_CLIENT_PORT:-9993})
declare -A SERVE_PORT=([a]=${LOCAL_CLUSTERS_A_SERVE_PORT:-8002} [b]=${LOCAL_CLUSTERS_B_SERVE_PORT:-8003})

say() { echo "local-clusters: $*"; }

# deploy/local-cluster.sh for cluster $1 (its own state dir and ports, the head alone); the rest are its arguments.
one() {
  local name=$1; shift
  LOCAL_CLUSTER_DIR="$DIR/$name" LOCAL_CLUSTER_HEAD_ONLY=1 LOCAL_CLUSTER_BIN="$BIN" \
    LOCAL_CLUSTER_GCS_PORT="${GCS_PORT[$name]}" LOCAL_CLUSTER_DASHBOARD_PORT="${DASHBOARD_PORT[$name]}" \
    LOCAL_CLUSTER_CLIENT_PORT="${CLIENT_PORT[$name]}" LOCAL_CLUSTER_CPUS_PER_NODE="${LOCAL_CLUSTERS_CPUS:-1}" \
    "$ONE" "$@"
}

# ORCHESTRATOR_CLUSTERS: one POST /v1/clusters body per cluster; the control plane reads each token from its file.
clusters_json() {
  local args=() name
  for name in "${CLUSTERS[@]}"; do
    args+=("$name" "http://127.0.0.1:${DASHBOARD_PORT[$name]}" "$DIR/$name/ray/auth_token" "$DIR/$name/storage"
      "${SERVE_PORT[$name]}")
  done
  "$BIN/python" - "${args[@]}" <<'EOF'
import json, sys
args = sys.argv[1:]
print(json.dumps([
    {"name": name, "address": address, "token_ref": f"file:{token}", "labels": {"pool": name},
     "storage_root": storage, "serve_port": int(port), "tenancy": "shared"}
    for name, address, token, storage, port in zip(*(args[i::5] for i in range(5)))
]))
EOF
}

print_export() {
  echo
  echo "# Before \`make run\` (the clusters are registered at start; bind a project: PUT /v1/projects/{id}/clusters):"
  echo "export ORCHESTRATOR_CLUSTERS='$(clusters_json)'"
  echo "export ORCHESTRATOR_CLUSTER_TOKEN_DIR='$DIR'  # where file: token refs may point"
}

cmd_start() {
  local name started=()
  mkdir -p "$DIR"
  for name in "${CLUSTERS[@]}"; do
    say "cluster $name: GCS ${GCS_PORT[$name]}, dashboard http://127.0.0.1:${DASHBOARD_PORT[$name]}, client ${CLIENT_PORT[$name]}"
    if ! one "$name" start; then
      say "cluster $name did not start; stopping the others"
      for name in "${started[@]}"; do one "$name" stop || true; done
      exit 1
    fi
    started+=("$name")
  done
  print_export
}

cmd_status() {
  local name running=0
  for name in "${CLUSTERS[@]}"; do
    echo "== cluster $name"
    if one "$name" status; then running=$((running + 1)); fi
  done
  [[ $running -gt 0 ]] || return 1
  print_export
}

cmd_stop() {
  local name failed=0
  for name in "${CLUSTERS[@]}"; do
    one "$name" stop || failed=1
  done
  return $failed
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
