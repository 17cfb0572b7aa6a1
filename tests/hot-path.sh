# Sourced by tests/callgrind.sh and tests/flamegraph.sh (tests/admit-cost.sh takes its free_port, from
# tests/bench-lib.sh): a Redis of its own and one replica serving the full stack's hot path but the database (JWT,
# the bucket, a quota and the in-flight cap in force, the conformance fixtures), for a profiler to watch under
# mcpfleet-bench.
#
#   hot_path_start BIN [WRAPPER...]   # starts both in $TMP (which the caller owns and removes)
# Sets REDIS_PID, SERVER_PID (the wrapper's, when there is one), TOKEN, MCP_URL and ADMIN_PORT.
# hot_path_stop stops both.
# HOT_PATH_SETUP picks how much of the stack the replica serves (cost.sh's SET=ladder, in instructions):
#   full (the default)   as above
#   in-memory            the same without Redis: the embedded store keeps the session, the bucket, the cap and quota
#   bare                 in-memory, no identity (--auth none), the bucket only (out of reach), no cap, no quota

. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh" # free_port

export MCPFLEET_REQUEST_STATE_KEYS="bench:$(head -c 32 /dev/urandom | base64 -w0)"

hot_path_start() {
  local bin="$1" port mcp
  shift
  port="$(free_port)"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  TOKEN="$("$bin" token --dev-key-file "$TMP/key.pem" --sub bench --scope mcp:access --ttl 1h)"
  mcp="$(free_port)" ADMIN_PORT="$(free_port)"
  rm -f "$TMP/out"
  local store=(--redis-url "redis://127.0.0.1:$port")
  local limits=(--auth dev --dev-key-file "$TMP/key.pem" --max-inflight-per-user 100000
    --quota test_simple_text=1000000000/1h)
  case "${HOT_PATH_SETUP:-full}" in
    full) ;;
    in-memory) store=() ;;
    bare) store=() limits=(--auth none --max-inflight-per-user 0) ;;
    *) echo "HOT_PATH_SETUP is full, in-memory or bare, not $HOT_PATH_SETUP" >&2; return 64 ;;
  esac
  "$@" "$bin" serve --listen "127.0.0.1:$mcp" --admin-listen "127.0.0.1:$ADMIN_PORT" --fixtures conformance \
    "${store[@]}" "${limits[@]}" --log info --rate-burst 1000000 --rate-per-second 1000000 \
    --max-sessions-per-user 0 >"$TMP/out" 2>"$TMP/err" &
  SERVER_PID=$!
  for _ in $(seq 600); do grep -q '^admin listening on ' "$TMP/out" 2>/dev/null && break; sleep 0.1; done
  MCP_URL="http://127.0.0.1:$mcp/mcp"
}

hot_path_stop() {
  kill "${SERVER_PID:-}" 2>/dev/null || true
  wait "${SERVER_PID:-}" 2>/dev/null || true
  kill "${REDIS_PID:-}" 2>/dev/null || true
  wait "${REDIS_PID:-}" 2>/dev/null || true
}
