# Sourced by tests/bench.sh and tests/cost.sh (and, for free_port, tests/hot-path.sh): the parts of a benchmark run
# that every benchmark starts the same way. The caller owns $TMP (a temp dir it removes), and calls bench_stop_all
# from its EXIT trap.
#
#   bench_setup                 # release builds of the server, the load generator and rmcp's server (BIN, BENCH,
#                               # RMCP), and a fresh TMP
#   bench_redis_start           # a redis-server of its own: REDIS_PID, REDIS_PORT, REDIS_URL
#   bench_postgres_start BIN    # a PostgreSQL of its own, migrated by BIN: PGDIR, PG_PORT, DB_URL, PG_MASTER
#   pg_cpu_ms                   # that PostgreSQL's CPU time so far (every backend), in ms
#   start_replica ARGS...       # one `serve` of SERVER_BIN (or BIN): appends to PIDS, URLS and ADMINS
#   stop_replicas               # stops them all, empties PIDS, URLS and ADMINS
#   rmcp_start [--stateless] / rmcp_stop   # rmcp's own server (RMCP): RMCP_PID, RMCP_URL

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

PIDS=()
URLS=()
ADMINS=()

bench_setup() {
  cargo build --release -q -p mcpfleet -p mcpfleet-loadgen -p mcpfleet-rmcp-baseline
  BIN=target/release/mcpfleet
  BENCH=target/release/mcpfleet-bench
  RMCP=target/release/rmcp-baseline
  TMP="$(mktemp -d)"
}

bench_redis_start() {
  REDIS_PORT="$(free_port)"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
  REDIS_PID=$!
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

# PostgreSQL of its own (initdb refuses root: it runs as the postgres user), migrated by BIN.
bench_postgres_start() {
  PGBIN=/usr/lib/postgresql/15/bin
  PGDIR="$(mktemp -d /tmp/mcpfleet-bench-pg.XXXXXX)"
  chown postgres "$PGDIR"
  PG_PORT="$(free_port)"
  runuser -u postgres -- "$PGBIN/initdb" -D "$PGDIR/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/log" -w start \
    -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PGDIR -c max_connections=200" >/dev/null
  DB_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  PG_MASTER="$(head -1 "$PGDIR/data/postmaster.pid")"
  "$1" migrate --database-url "$DB_URL" >/dev/null
}

# The CPU time of the bench's PostgreSQL (the postmaster and every backend), in ms.
pg_cpu_ms() {
  [[ -z "${PG_MASTER:-}" ]] && { echo 0; return; }
  local total=0 p t
  for p in "$PG_MASTER" $(pgrep -P "$PG_MASTER"); do
    t="$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)"
    total=$(( total + t ))
  done
  echo $(( total * 1000 / $(getconf CLK_TCK) ))
}

# start_replica ARGS... : starts one replica, appends its pid to PIDS, its URL to URLS and its metrics to ADMINS.
start_replica() {
  local n="${#PIDS[@]}"
  # As in rmcp_start: no earlier replica's address may be read from a file this one has not truncated yet.
  rm -f "$TMP/out.$n" "$TMP/err.$n"
  # The rate limit stays on (every request is admitted as in production) but out of reach, and the caps are off:
  # one principal drives the load. A setup's own flags override these (they are environment defaults). No drain
  # delay: a replica stops at once when its setup is done.
  MCPFLEET_DRAIN_DELAY=0s MCPFLEET_RATE_BURST=1000000 MCPFLEET_RATE_PER_SECOND=1000000 MCPFLEET_MAX_SESSIONS_PER_USER=0 \
    MCPFLEET_MAX_INFLIGHT_PER_USER=0 MCPFLEET_FIXTURES=conformance \
    "${SERVER_BIN:-$BIN}" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --log "${LOG:-info}" "$@" \
    >"$TMP/out.$n" 2>"$TMP/err.$n" &
  PIDS+=($!)
  for _ in $(seq 200); do grep -q '^admin listening on ' "$TMP/out.$n" 2>/dev/null && break; sleep 0.05; done
  if ! grep -q '^admin listening on ' "$TMP/out.$n"; then
    echo "replica $n did not start in 10 s: $(tail -1 "$TMP/err.$n")" >&2
    return 1
  fi
  URLS+=("http://$(sed -n 's/^listening on //p' "$TMP/out.$n")/mcp")
  ADMINS+=("http://$(sed -n 's/^admin listening on //p' "$TMP/out.$n")/metrics")
}

stop_replicas() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
  URLS=()
  ADMINS=()
}

# rmcp's own Streamable HTTP server (crates/rmcp-baseline: in-process sessions, no auth, no store), one process, so
# every session stays on it as a sticky balancer would keep it. With --stateless, its legacy session mode is off and
# a response that comes first is plain JSON (rmcp serves a 2026-07-28 request without a session either way).
rmcp_start() {
  # The previous run's file goes first: the redirection below truncates it only once the child runs, and until then
  # the wait would read the old address.
  rm -f "$TMP/rmcp.out" "$TMP/rmcp.err"
  "$RMCP" "$@" 127.0.0.1:0 >"$TMP/rmcp.out" 2>"$TMP/rmcp.err" &
  RMCP_PID=$!
  for _ in $(seq 200); do grep -q '^listening on ' "$TMP/rmcp.out" 2>/dev/null && break; sleep 0.05; done
  if ! grep -q '^listening on ' "$TMP/rmcp.out"; then
    echo "rmcp-baseline did not start in 10 s: $(cat "$TMP/rmcp.err")" >&2
    return 1
  fi
  RMCP_URL="http://$(sed -n 's/^listening on //p' "$TMP/rmcp.out")/mcp"
}

rmcp_stop() {
  kill "$RMCP_PID" 2>/dev/null || true
  wait "$RMCP_PID" 2>/dev/null || true
}

bench_stop_all() {
  stop_replicas
  [[ -n "${RMCP_PID:-}" ]] && rmcp_stop
  [[ -n "${REDIS_PID:-}" ]] && kill "$REDIS_PID" 2>/dev/null || true
  [[ -n "${PGDIR:-}" ]] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDIR/data" stop -m immediate >/dev/null 2>&1 || true
  [[ -n "${PGDIR:-}" ]] && rm -rf "$PGDIR"
  return 0
}
