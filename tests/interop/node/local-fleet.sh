#!/usr/bin/env bash
# Manual interop runs: starts a fleet like tests/interop.rs does (a private redis-server, N replicas of
# target/debug/mcpfleet with the conformance fixtures, and rr-proxy.mjs in front), exports MCP_URL (the proxy's
# /mcp), runs the given command, then stops everything it started.
#
#   tests/interop/node/local-fleet.sh '.tools/node_modules/.bin/node tests/interop/node/workflow-sdk1.mjs --url $MCP_URL'
#   REPLICAS=1 tests/interop/node/local-fleet.sh ...             # one replica on the in-memory store, no proxy
#   SERVE_ARGS='--auth dev' tests/interop/node/local-fleet.sh ...  # extra `mcpfleet serve` flags
#   KEEP=1 tests/interop/node/local-fleet.sh 'echo $MCP_URL; sleep 600'
set -euo pipefail
cd "$(dirname "$0")/../../.."
REPLICAS=${REPLICAS:-3}
NODE=.tools/node_modules/.bin/node
BIN=${MCPFLEET_BIN:-target/debug/mcpfleet}
LOGDIR=$(mktemp -d /tmp/mcpfleet-interop.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP_LOGS:-}" ] && echo "logs in $LOGDIR" >&2 || rm -rf "$LOGDIR"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

common=(serve --fixtures conformance --log warn ${SERVE_ARGS:-})
if [ "$REPLICAS" -gt 1 ]; then
  rport=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$LOGDIR/redis.log" 2>&1 &
  pids+=($!)
  wait_port "$rport"
  key="k1:$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
  common+=(--redis-url "redis://127.0.0.1:$rport" --redis-prefix "interop:" --replicas "$REPLICAS" --request-state-key "$key")
fi
ups=()
for i in $(seq 1 "$REPLICAS"); do
  p=$(free_port); a=$(free_port)
  "$BIN" "${common[@]}" --listen "127.0.0.1:$p" --admin-listen "127.0.0.1:$a" >"$LOGDIR/replica$i.out" 2>"$LOGDIR/replica$i.err" &
  pids+=($!)
  ups+=("127.0.0.1:$p")
done
for u in "${ups[@]}"; do wait_port "${u#*:}"; done
if [ "$REPLICAS" -gt 1 ]; then
  pp=$(free_port)
  "$NODE" tests/interop/node/rr-proxy.mjs --listen "127.0.0.1:$pp" --upstream "$(IFS=,; echo "${ups[*]}")" ${PROXY_LOG:+--log} >"$LOGDIR/proxy.log" 2>&1 &
  pids+=($!)
  wait_port "$pp"
  export MCP_URL="http://127.0.0.1:$pp/mcp"
else
  export MCP_URL="http://${ups[0]}/mcp"
fi
echo "fleet: $REPLICAS replica(s) at ${ups[*]}; MCP_URL=$MCP_URL" >&2
set +e
bash -c "$*"
rc=$?
if [ -n "${SHOW_LOGS:-}" ] || [ $rc -ne 0 ]; then tail -n 20 "$LOGDIR"/*.err "$LOGDIR"/*.log 2>/dev/null >&2; fi
exit $rc
