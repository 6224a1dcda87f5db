#!/usr/bin/env bash
# The multi-process topology of deploy/docker-compose.yaml without Docker, as processes on this machine:
# a Ray head, a second Ray node joined to it (`ray start --address`), PostgreSQL, and the control plane
# pointed at that cluster through RAY_ADDRESS, exactly as it is on Kubernetes.
#
#   deploy/local-cluster.sh start    start everything (refuses while a cluster of this state dir runs)
#   deploy/local-cluster.sh status   what runs, where, and the admin token's location (exit 1: nothing runs)
#   deploy/local-cluster.sh stop     stop everything it started; nothing is left running
#
# Settings (environment; `start` records them in $LOCAL_CLUSTER_DIR/state.env for status/stop):
#   LOCAL_CLUSTER_DIR        state dir: pids, logs, Ray token, storage   (default <repo>/var/local-cluster)
#   LOCAL_CLUSTER_API_PORT   control plane port on 127.0.0.1              (default 8010; Ray Serve takes 8001)
#   LOCAL_CLUSTER_GCS_PORT   Ray GCS port of the head                     (default 6391; `make run` uses 6390)
#   LOCAL_CLUSTER_DASHBOARD_PORT  Ray dashboard / Jobs API on 127.0.0.1   (default 8266; `make run` uses 8265)
#   LOCAL_CLUSTER_CLIENT_PORT     Ray client server port                  (default 10000; Ray workers take 10002-19999)
#   LOCAL_CLUSTER_CPUS_PER_NODE   logical CPUs of each Ray node           (default 1: a 2-worker job spans both)
#   LOCAL_CLUSTER_OBJECT_STORE_BYTES  object store of each Ray node         (default 500000000)
#   LOCAL_CLUSTER_DB         PostgreSQL database, created if missing      (default orchestrator_local)
#   LOCAL_CLUSTER_PG_HOST / _PG_PORT / _PG_USER   the server              (default 127.0.0.1 / 5432 / postgres)
#   ORCHESTRATOR_ADMIN_TOKEN admin key; unset: one is generated into $LOCAL_CLUSTER_DIR/admin_token
#   LOCAL_CLUSTER_BIN        directory with python, ray, orchestrator     (default <repo>/.venv/bin)
#   LOCAL_CLUSTER_HEAD_ONLY  1: the Ray head alone: no second node, no database, no control plane
#                            (default 0; deploy/local-clusters.sh starts two such clusters for `make run`)
#
# Ray token auth is on: one token file ($LOCAL_CLUSTER_DIR/ray/auth_token, mode 0600) is given to both
# nodes and to the control plane as RAY_AUTH_MODE=token + RAY_AUTH_TOKEN_PATH. Dashboards listen on
# 127.0.0.1 only. Each component runs in its own session (setsid); `stop` sends SIGTERM, waits, then
# SIGKILLs whatever is left in those sessions.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$(realpath -m "${LOCAL_CLUSTER_DIR:-$ROOT/var/local-cluster}")
STATE=$DIR/state.env
COMPONENTS=(api worker head)  # stop order; start is the reverse

die() { echo "local-cluster: $*" >&2; exit 1; }
say() { echo "local-cluster: $*"; }

load_settings() {
  # A running cluster's recorded settings win over the environment, so `stop` finds what `start` made.
  if [[ -f $STATE ]]; then
    # shellcheck disable=SC1090
    source "$STATE"
    HEAD_ONLY=${HEAD_ONLY:-0}  # a state file written before the setting existed
    return 0
  fi
  BIN=${LOCAL_CLUSTER_BIN:-$ROOT/.venv/bin}
  API_PORT=${LOCAL_CLUSTER_API_PORT:-8010}
  GCS_PORT=${LOCAL_CLUSTER_GCS_PORT:-6391}
  DASHBOARD_PORT=${LOCAL_CLUSTER_DASHBOARD_PORT:-8266}
  CLIENT_PORT=${LOCAL_CLUSTER_CLIENT_PORT:-10000}
  CPUS_PER_NODE=${LOCAL_CLUSTER_CPUS_PER_NODE:-1}
  OBJECT_STORE_BYTES=${LOCAL_CLUSTER_OBJECT_STORE_BYTES:-500000000}
  DB=${LOCAL_CLUSTER_DB:-orchestrator_local}
  PG_HOST=${LOCAL_CLUSTER_PG_HOST:-127.0.0.1}
  PG_PORT=${LOCAL_CLUSTER_PG_PORT:-5432}
  PG_USER=${LOCAL_CLUSTER_PG_USER:-postgres}
  HEAD_ONLY=${LOCAL_CLUSTER_HEAD_ONLY:-0}
}

save_settings() {
  local name
  : >"$STATE"
  for name in BIN API_PORT GCS_PORT DASHBOARD_PORT CLIENT_PORT CPUS_PER_NODE OBJECT_STORE_BYTES DB PG_HOST PG_PORT PG_USER HEAD_ONLY; do
    printf '%s=%q\n' "$name" "${!name}" >>"$STATE"
  done
}

pid_of() { cat "$DIR/pids/$1.pid" 2>/dev/null || true; }

alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# Every live process in the session a component was started in (its pid is the session id).
session_members() { ps -eo pid=,sid=,stat= | awk -v sid="$1" '$2 == sid && $3 !~ /^Z/ {print $1}'; }

free_port() { "$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

dashboard_nodes() {  # number of alive Ray nodes the dashboard reports (0 when it does not answer)
  "$BIN/python" - "$DASHBOARD_PORT" "$DIR/ray/auth_token" <<'EOF' 2>/dev/null || echo 0
import sys, httpx
port, token_file = sys.argv[1], sys.argv[2]
token = open(token_file).read().strip()
r = httpx.get(f"http://127.0.0.1:{port}/api/v0/nodes", headers={"Authorization": f"Bearer {token}"},
              params={"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE"}, timeout=5)
r.raise_for_status()
print(len(r.json()["data"]["result"]["result"]))
EOF
}

nodes_at_least() { [[ $(dashboard_nodes) -ge $1 ]]; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMPONENT COMMAND...: poll COMMAND until it succeeds
  local timeout=$1 what=$2 component=$3; shift 3
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    if ! alive "$(pid_of "$component")"; then
      tail -n 40 "$DIR/logs/$component.log" >&2 || true
      die "$component exited while waiting for $what (log: $DIR/logs/$component.log)"
    fi
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what (log: $DIR/logs/$component.log)"
    sleep 1
  done
}

launch() {  # launch NAME COMMAND...: run in a new session, output to logs/NAME.log, pid to pids/NAME.pid
  local name=$1; shift
  # Without job control a background child is not a group leader, so setsid execs in place: $! is
  # the session leader, whose pid is also the session id that `stop` sweeps.
  setsid "$@" >>"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/pids/$name.pid"
}

ensure_database() {
  command -v psql >/dev/null || die "psql is not installed (apt-get install postgresql-client)"
  pg_isready -h "$PG_HOST" -p "$PG_PORT" -q || die "PostgreSQL is not answering on $PG_HOST:$PG_PORT (scripts/ensure-postgres.sh starts it)"
  local exists
  exists=$(psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres -Atc \
    "SELECT 1 FROM pg_database WHERE datname = '$DB'")
  if [[ $exists != 1 ]]; then
    createdb -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" "$DB"
    say "created database $DB"
  fi
}

cmd_start() {
  local c
  for c in "${COMPONENTS[@]}"; do
    if alive "$(pid_of "$c")"; then die "already running ($c pid $(pid_of "$c")); run '$0 stop' first"; fi
  done
  mkdir -p "$DIR/pids" "$DIR/logs" "$DIR/ray" "$DIR/storage"
  rm -f "$STATE"; load_settings; save_settings  # fresh settings from the environment
  # A start that fails half-way stops what it had started.
  trap 'if [[ ${started:-0} != 1 ]]; then say "start failed; stopping what it started"; cmd_stop; fi' EXIT
  [[ -x $BIN/ray && -x $BIN/orchestrator ]] || die "no ray/orchestrator in $BIN (run 'make install')"
  [[ $HEAD_ONLY == 1 ]] || ensure_database

  # One token for both nodes and the control plane.
  if [[ ! -s $DIR/ray/auth_token ]]; then
    (umask 077 && "$BIN/python" -c 'import secrets; print(secrets.token_hex(32))' >"$DIR/ray/auth_token")
  fi
  if [[ $HEAD_ONLY != 1 && -z ${ORCHESTRATOR_ADMIN_TOKEN:-} && ! -s $DIR/admin_token ]]; then
    (umask 077 && "$BIN/python" -c 'import secrets; print("adm_" + secrets.token_urlsafe(24))' >"$DIR/admin_token")
  fi
  local admin_token=${ORCHESTRATOR_ADMIN_TOKEN:-$(cat "$DIR/admin_token" 2>/dev/null || true)}

  local -a ray_env=(
    # RAY_ADDRESS: its own GCS for every Ray process, else an address Ray resolves itself comes from the
    # machine-wide /tmp/ray/ray_current_cluster, the last head's (another cluster's: local-clusters.sh).
    env -u RAY_AUTH_TOKEN RAY_ADDRESS="127.0.0.1:$GCS_PORT"
    RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$DIR/ray/auth_token"
    # Drivers run `python -m workers.train.driver` through a shell: this interpreter first on PATH.
    PATH="$BIN:$PATH"
    RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=5
  )
  # Both nodes run on this machine: give each its own agent port (the default 52365 fits only one).
  say "starting the Ray head (GCS 127.0.0.1:$GCS_PORT, dashboard http://127.0.0.1:$DASHBOARD_PORT, $CPUS_PER_NODE CPU)"
  launch head "${ray_env[@]}" "$BIN/ray" start --head --block \
    --port "$GCS_PORT" --node-ip-address 127.0.0.1 \
    --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" \
    --ray-client-server-port "$CLIENT_PORT" --dashboard-agent-listen-port "$(free_port)" \
    --num-cpus "$CPUS_PER_NODE" --num-gpus 0 --object-store-memory "$OBJECT_STORE_BYTES" --disable-usage-stats
  wait_for 90 "the Ray head" head nodes_at_least 1
  if [[ $HEAD_ONLY == 1 ]]; then
    started=1
    cmd_status
    return
  fi

  say "starting a second Ray node (ray start --address 127.0.0.1:$GCS_PORT, $CPUS_PER_NODE CPU)"
  launch worker "${ray_env[@]}" "$BIN/ray" start --block --address "127.0.0.1:$GCS_PORT" \
    --node-ip-address 127.0.0.1 --dashboard-agent-listen-port "$(free_port)" \
    --num-cpus "$CPUS_PER_NODE" --num-gpus 0 --object-store-memory "$OBJECT_STORE_BYTES" --disable-usage-stats
  wait_for 90 "the second Ray node to join" worker nodes_at_least 2

  say "starting the control plane on http://127.0.0.1:$API_PORT (database $DB, RAY_ADDRESS http://127.0.0.1:$DASHBOARD_PORT)"
  launch api env -u RAY_AUTH_TOKEN \
    RAY_ADDRESS="http://127.0.0.1:$DASHBOARD_PORT" RAY_AUTH_TOKEN_PATH="$DIR/ray/auth_token" \
    ORCHESTRATOR_DATABASE_URL="postgresql+psycopg://$PG_USER@$PG_HOST:$PG_PORT/$DB" \
    ORCHESTRATOR_HOST=127.0.0.1 ORCHESTRATOR_PORT="$API_PORT" \
    ORCHESTRATOR_PUBLIC_URL="http://127.0.0.1:$API_PORT" \
    ORCHESTRATOR_STORAGE="$DIR/storage" ORCHESTRATOR_VAR_DIR="$DIR" \
    ORCHESTRATOR_ADMIN_TOKEN="$admin_token" \
    "$BIN/orchestrator" serve
  # /readyz answers 200 once the database does; "ray": "ok ..." says the control plane reaches Ray too.
  wait_for 120 "the control plane to be ready" api \
    sh -c "curl -sf 'http://127.0.0.1:$API_PORT/readyz' | grep -q '\"ray\":\"ok'"
  started=1
  cmd_status
}

cmd_status() {
  load_settings
  local c pid running=0 components=(head worker api)
  [[ $HEAD_ONLY == 1 ]] && components=(head)
  for c in "${components[@]}"; do
    pid=$(pid_of "$c")
    if alive "$pid"; then echo "$c: running (pid $pid)"; running=$((running + 1)); else echo "$c: stopped"; fi
  done
  [[ $HEAD_ONLY == 1 ]] || echo "api:       http://127.0.0.1:$API_PORT   (admin token: ${ORCHESTRATOR_ADMIN_TOKEN:+\$ORCHESTRATOR_ADMIN_TOKEN}${ORCHESTRATOR_ADMIN_TOKEN:-$DIR/admin_token})"
  echo "dashboard: http://127.0.0.1:$DASHBOARD_PORT   (Ray token: $DIR/ray/auth_token; alive nodes: $(dashboard_nodes))"
  [[ $HEAD_ONLY == 1 ]] || echo "database:  postgresql+psycopg://$PG_USER@$PG_HOST:$PG_PORT/$DB"
  echo "state:     $DIR"
  [[ $running -gt 0 ]]
}

cmd_stop() {
  load_settings
  local c pid deadline left
  for c in "${COMPONENTS[@]}"; do
    pid=$(pid_of "$c")
    [[ -n $pid ]] || continue
    if alive "$pid"; then
      say "stopping $c (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 40))
      while alive "$pid" && ((SECONDS < deadline)); do sleep 0.5; done
    fi
    # Whatever the component left behind in its session (Ray workers, agents) goes too.
    left=$(session_members "$pid")
    if [[ -n $left ]]; then
      say "killing what is left of $c: $(echo $left)"
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
      deadline=$((SECONDS + 10))
      while [[ -n $(session_members "$pid") ]] && ((SECONDS < deadline)); do sleep 0.2; done
    fi
    rm -f "$DIR/pids/$c.pid"
  done
  rm -f "$STATE"
  say "stopped"
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
