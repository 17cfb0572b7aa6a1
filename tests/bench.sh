#!/usr/bin/env bash
# The load benchmark, side by side in one run: builds release binaries, starts its own redis-server on a free
# port, and for each setup starts the replicas, runs mcpfleet-bench against them, and stops them.
#
#   tests/bench.sh            # 10 s per setup, 16 sessions
#   SECS=30 SESSIONS=32 tests/bench.sh
#   ONLY='in-flight|^1 replica, Redis$' tests/bench.sh   # only the setups whose label matches
#   BASE=HEAD~1 ONLY='full stack' tests/bench.sh          # each setup with BASE's binary, then with this tree's
#
# With BASE (a git revision), the binary of that revision is built in a worktree (target dir target/bench-base,
# kept between runs) and every mcpfleet setup runs twice in a row, "[base]" first: a change's effect side by side
# in one run. BASE_BIN=<path> names a base binary already built instead.
# Setups: rmcp's own server (the baseline: crates/rmcp-baseline); 1 replica in-memory; 1 replica + Redis;
# 3 replicas + Redis (requests round-robin over them); the last two again with bearer tokens (--auth dev: Ed25519
# JWTs, verified on every request, cached per token); then the 2026-07-28 generation (stateless calls, no session) on 1 and 3 replicas, and with an idempotency key per call;
# then the tasks extension through 3 replicas with JWTs: tasks/get polls of a live task beside plain 2026 tools/call
# on the same fleet; then PostgreSQL (its own server, migrated, demo data at scale 1): the hot path with the audit
# trail on and off, the full stack (JWT, every limit in force, the audit trail) on 1 and 3 replicas, and the
# reference tools (full-text search_docs, get_ticket) through 3 replicas; and Redis memory per idle session on the
# full stack (IDLE_SESSIONS sessions, 10000 by default).
# Columns: see docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${SECS:-10}"
SESSIONS="${SESSIONS:-16}"
LOG="${LOG:-info}"

. tests/bench-lib.sh
bench_setup
HA_PIDS=()
BINS=("$BIN")
if [[ -n "${BASE_BIN:-}" ]]; then
  BINS=("$BASE_BIN" "$BIN")
elif [[ -n "${BASE:-}" ]]; then
  git worktree add --detach -q "$TMP/base" "$BASE"
  (cd "$TMP/base" && cargo build --release -q -p mcpfleet --target-dir "$OLDPWD/target/bench-base")
  cp target/bench-base/release/mcpfleet "$TMP/mcpfleet-base"
  BINS=("$TMP/mcpfleet-base" "$BIN")
fi
cleanup() {
  [[ -n "${BASE:-}" ]] && git worktree remove --force "$TMP/base" 2>/dev/null || true
  for p in "${HA_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  bench_stop_all
  rm -rf "$TMP"
}
trap cleanup EXIT

bench_redis_start

# A 6-node Redis Cluster (3 masters, 3 replicas) and a Sentinel setup (a master, a replica, 3 sentinels), for the
# setups that compare them with the standalone Redis above.
ha_node() { # ha_node DIR PORT ARGS... : one redis-server of a topology, in a dir of its own
  local dir="$1" port="$2"; shift 2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" "$@" >"$dir/log" 2>&1 &
  HA_PIDS+=($!)
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
CLUSTER_SEEDS=() CLUSTER_MASTER_URLS=()
for i in 1 2 3 4 5 6; do
  p="$(free_port)"
  ha_node "$TMP/cluster$i" "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
    --cluster-port "$(free_port)"
  CLUSTER_SEEDS+=("127.0.0.1:$p")
done
redis-cli --cluster create "${CLUSTER_SEEDS[@]}" --cluster-replicas 1 --cluster-yes >"$TMP/cluster-create.log" 2>&1
for _ in $(seq 100); do
  [[ "$(redis-cli -p "${CLUSTER_SEEDS[0]#*:}" cluster info | tr -d '\r' | grep cluster_state)" == cluster_state:ok ]] && break
  sleep 0.1
done
for n in "${CLUSTER_SEEDS[@]}"; do
  redis-cli -p "${n#*:}" role | head -1 | grep -q master && CLUSTER_MASTER_URLS+=(--redis-url "redis://$n")
done
SENTINEL_MASTER_PORT="$(free_port)"
ha_node "$TMP/sentinel-master" "$SENTINEL_MASTER_PORT"
ha_node "$TMP/sentinel-replica" "$(free_port)" --replicaof 127.0.0.1 "$SENTINEL_MASTER_PORT"
SENTINELS=()
for i in 1 2 3; do
  p="$(free_port)"
  mkdir -p "$TMP/sentinel$i"
  printf 'port %s\nbind 127.0.0.1\nsentinel monitor bench 127.0.0.1 %s 2\nsentinel down-after-milliseconds bench 2000\n' \
    "$p" "$SENTINEL_MASTER_PORT" >"$TMP/sentinel$i/sentinel.conf"
  redis-server "$TMP/sentinel$i/sentinel.conf" --sentinel --dir "$TMP/sentinel$i" >"$TMP/sentinel$i/log" 2>&1 &
  HA_PIDS+=($!)
  SENTINELS+=("127.0.0.1:$p")
done
for _ in $(seq 100); do redis-cli -p "${SENTINELS[0]#*:}" sentinel get-master-addr-by-name bench >/dev/null 2>&1 && break; sleep 0.1; done
CLUSTER_FLAGS=(--redis-mode cluster --redis-nodes "$(IFS=,; echo "${CLUSTER_SEEDS[*]}")")
SENTINEL_FLAGS=(--redis-mode sentinel --redis-nodes "$(IFS=,; echo "${SENTINELS[*]}")" --redis-sentinel-master bench)

# selected LABEL: whether ONLY (a regex, when set) lets this setup run.
selected() { [[ -z "${ONLY:-}" || "$1" =~ $ONLY ]]; }

# take_header: HEADER is --header for the first setup that runs, the table's header going with it.
take_header() {
  HEADER=""
  if [[ -z "${HEADER_DONE:-}" ]]; then HEADER=--header; HEADER_DONE=1; fi
}

# run LABEL REPLICAS EXTRA_BENCH_ARGS -- SERVER_ARGS... : the setup with each binary of BINS (BASE's first).
run() {
  local label="$1"
  selected "$label" || return 0
  shift
  for SERVER_BIN in "${BINS[@]}"; do run_one "$(labelled "$label")" "$@"; done
  SERVER_BIN=""
}

# labelled LABEL: LABEL, with " [base]" when SERVER_BIN is BASE's binary.
labelled() {
  if [[ "${#BINS[@]}" -gt 1 && "$SERVER_BIN" == "${BINS[0]}" ]]; then echo "$1 [base]"; else echo "$1"; fi
}

run_one() {
  local label="$1" replicas="$2"; shift 2
  take_header
  local bench_args=() server_args=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do bench_args+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  server_args=("$@")
  URLS=()
  ADMINS=()
  for _ in $(seq "$replicas"); do start_replica "${server_args[@]}"; done
  local url_args=() pid_args=()
  for u in "${URLS[@]}"; do url_args+=(--url "$u"); done
  for m in "${ADMINS[@]}"; do url_args+=(--metrics "$m"); done
  for p in "${PIDS[@]}"; do pid_args+=(--pid "$p"); done
  local pg_before row
  pg_before="$(pg_cpu_ms)"
  row="$("$BENCH" "${url_args[@]}" "${pid_args[@]}" --sessions "$SESSIONS" --secs "$SECS" --label "$label" $HEADER "${bench_args[@]}")"
  echo "$row"
  # PostgreSQL's own CPU (every backend, warm-up included) per measured call, for the setups that use it.
  if [[ " ${server_args[*]} " == *" --database-url "* ]]; then
    local calls
    calls="$(echo "$row" | tail -1 | awk -F'|' '{gsub(/ /, "", $4); print $4}')"
    echo "  PostgreSQL CPU: $(( $(pg_cpu_ms) - pg_before )) ms over the run, $calls calls measured"
  fi
  stop_replicas
}

# run_idle LABEL SERVER_ARGS...: Redis memory per idle session (IDLE_SESSIONS of them, 10000 by default: each an
# initialize and its notifications/initialized) with each binary of BINS, on an emptied Redis (FLUSHALL, so that
# the keys of the setups before, expiring meanwhile, do not shrink the figure).
run_idle() {
  local label="$1"
  shift
  selected "$label" || return 0
  for SERVER_BIN in "${BINS[@]}"; do
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    start_replica "$@"
    "$BENCH" --url "${URLS[0]}" --token "$TOKEN" --redis-url "$REDIS_URL" --idle-sessions "${IDLE_SESSIONS:-10000}" \
      --label "$(labelled "$label")"
    stop_replicas
  done
  SERVER_BIN=""
}

# run_rmcp LABEL: the baseline, rmcp's own Streamable HTTP server (crates/rmcp-baseline: in-process sessions, no
# auth, no store), one process, so every session stays on it as a sticky balancer would keep it.
run_rmcp() {
  local label="$1"
  selected "$label" || return 0
  take_header
  rmcp_start
  "$BENCH" --url "$RMCP_URL" --pid "$RMCP_PID" --sessions "$SESSIONS" --secs "$SECS" --label "$label" $HEADER
  rmcp_stop
}

KEY="$TMP/dev-key.pem"
# Every replica of a fleet shares one requestState key (required with Redis).
export MCPFLEET_REQUEST_STATE_KEYS="bench:$(head -c 32 /dev/urandom | base64 -w0)"
TOKEN="$("$BIN" token --dev-key-file "$KEY" --sub bench --scope mcp:access --ttl 1h)"

bench_postgres_start "$BIN"
"$BIN" demo-data --database-url "$DB_URL" --scale 1
RTOKEN="$("$BIN" token --dev-key-file "$KEY" --sub bench --scope 'mcp:access tools:read tools:write' --ttl 1h)"

echo "mcpfleet-bench: tools/call test_simple_text, $SESSIONS sessions, ${SECS} s per setup, log level $LOG, $(nproc) cores"
run_rmcp "rmcp 3.11, in-process sessions, no auth"
run "1 replica, in-memory" 1 --
run "1 replica, Redis" 1 --redis-url "$REDIS_URL" -- --redis-url "$REDIS_URL"
run "3 replicas, Redis, round-robin" 3 --redis-url "$REDIS_URL" -- --redis-url "$REDIS_URL"
run "1 replica, Redis, no limits" 1 --redis-url "$REDIS_URL" -- --redis-url "$REDIS_URL" \
  --rate-burst 0
run "1 replica, Redis, bucket + quota + in-flight cap" 1 --redis-url "$REDIS_URL" -- --redis-url "$REDIS_URL" \
  --max-inflight-per-user 100000 --quota test_simple_text=1000000000/1h
run "3 replicas, Redis, round-robin, bucket + quota + in-flight cap" 3 --redis-url "$REDIS_URL" -- \
  --redis-url "$REDIS_URL" --max-inflight-per-user 100000 --quota test_simple_text=1000000000/1h
run "1 replica, Redis, JWT" 1 --redis-url "$REDIS_URL" --token "$TOKEN" -- \
  --redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY"
run "3 replicas, Redis, JWT, round-robin" 3 --redis-url "$REDIS_URL" --token "$TOKEN" -- \
  --redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY"
# The same fleet on a Redis Cluster and behind Sentinel, beside the standalone Redis: one principal's keys share one
# slot, so its calls go to one master; the hot path stays one round trip.
run "3 replicas, Redis Cluster (3 masters), JWT, round-robin" 3 "${CLUSTER_MASTER_URLS[@]}" --token "$TOKEN" -- \
  "${CLUSTER_FLAGS[@]}" --auth dev --dev-key-file "$KEY"
run "3 replicas, Sentinel, JWT, round-robin" 3 --redis-url "redis://127.0.0.1:$SENTINEL_MASTER_PORT" \
  --token "$TOKEN" -- "${SENTINEL_FLAGS[@]}" --auth dev --dev-key-file "$KEY"
run "1 replica, Redis, 2026-07-28" 1 --redis-url "$REDIS_URL" --generation 2026 -- --redis-url "$REDIS_URL"
run "3 replicas, Redis, round-robin, 2026-07-28" 3 --redis-url "$REDIS_URL" --generation 2026 -- \
  --redis-url "$REDIS_URL"
run "1 replica, Redis, 2026-07-28, idempotency keys" 1 --redis-url "$REDIS_URL" --generation 2026 \
  --idempotency-keys -- --redis-url "$REDIS_URL"
# The tasks extension: each loop first queues one slow_job of 600 s (always a task; the conformance fixtures), then
# polls it with tasks/get round-robin, so each poll lands on any replica; the tasks are cancelled at the end. Beside
# it, plain 2026 tools/call through the same fleet. One principal holds every task: the task cap is the sessions.
TASK_FLEET=(--redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY" --fixtures conformance
  --max-tasks-per-user "$SESSIONS")
run "3 replicas, Redis, JWT, round-robin, 2026-07-28: tools/call" 3 --redis-url "$REDIS_URL" --token "$TOKEN" \
  --generation 2026 -- "${TASK_FLEET[@]}"
run "3 replicas, Redis, JWT, round-robin, 2026-07-28: tasks/get poll" 3 --redis-url "$REDIS_URL" \
  --token "$TOKEN" --generation 2026 --op tasks-get --tool slow_job --args '{"seconds":600}' -- "${TASK_FLEET[@]}"
run "1 replica, Redis, JWT, audit trail off" 1 --redis-url "$REDIS_URL" --token "$TOKEN" -- \
  --redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY" --database-url "$DB_URL" --audit-trail off
run "1 replica, Redis, JWT, audit trail on" 1 --redis-url "$REDIS_URL" --token "$TOKEN" -- \
  --redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY" --database-url "$DB_URL"
# The full stack (issue 19): JWT, the bucket, a quota and the in-flight cap in force (out of the one principal's
# reach), argument validation, and the audit trail on.
FULL_STACK=(--redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY" --database-url "$DB_URL"
  --max-inflight-per-user 100000 --quota test_simple_text=1000000000/1h)
run "1 replica, full stack" 1 --redis-url "$REDIS_URL" --token "$TOKEN" -- "${FULL_STACK[@]}"
run "1 replica, full stack, one worker thread" 1 --redis-url "$REDIS_URL" --token "$TOKEN" -- "${FULL_STACK[@]}" \
  --worker-threads 1
run "3 replicas, full stack, round-robin" 3 --redis-url "$REDIS_URL" --token "$TOKEN" -- "${FULL_STACK[@]}"
run "3 replicas, full stack, round-robin, one worker thread each" 3 --redis-url "$REDIS_URL" --token "$TOKEN" -- \
  "${FULL_STACK[@]}" --worker-threads 1
run_idle "1 replica, full stack: Redis memory per idle session" "${FULL_STACK[@]}"
run "3 replicas, Redis, JWT, PostgreSQL: search_docs" 3 --redis-url "$REDIS_URL" --token "$RTOKEN" \
  --tool search_docs --args '{"query":"refund policy","limit":5}' -- \
  --redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY" --fixtures reference --database-url "$DB_URL"
run "3 replicas, Redis, JWT, PostgreSQL: get_ticket" 3 --redis-url "$REDIS_URL" --token "$RTOKEN" \
  --tool get_ticket --args '{"project":"billing","number":1}' -- \
  --redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY" --fixtures reference --database-url "$DB_URL"
