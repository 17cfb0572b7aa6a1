#!/usr/bin/env bash
# Instructions per tools/call, counted by valgrind's callgrind: stable on a noisy machine, where calls/s and CPU
# time are not. For each binary given (default: this tree's release build), starts a Redis of its own and one
# replica under callgrind with JWT, the bucket, a quota and the in-flight cap in force, warms it up, counts the
# instructions of a fixed load (mcpfleet-bench, 4 sessions), and prints the replica's instructions per call
# (every thread; the count starts after the warm-up, so start-up is not in it).
#
#   tests/callgrind.sh                                   # this tree
#   tests/callgrind.sh /tmp/mcpfleet-before target/release/mcpfleet   # side by side
#   KEEP=/tmp/cg tests/callgrind.sh     # also keeps each profile there, for callgrind_annotate
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${SECS:-10}"
cargo build --release -q -p mcpfleet -p mcpfleet-loadgen
BENCH=target/release/mcpfleet-bench
[[ $# -gt 0 ]] || set -- target/release/mcpfleet

TMP="$(mktemp -d)"
. tests/hot-path.sh
cleanup() { pkill -f "valgrind.*$TMP" 2>/dev/null || true; hot_path_stop; rm -rf "$TMP"; }
trap cleanup EXIT
calls() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^mcp_tool_calls_total\{.*outcome="ok"/ { s += $2 } END { print s + 0 }'; }

echo "| binary | calls counted | instructions per call |"
echo "|---|---|---|"
for bin in "$@"; do
  hot_path_start "$bin" valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/cg.%p"
  # Warm-up (caches, the token's verdict, lazy statics), then count a fixed load.
  "$BENCH" --url "$MCP_URL" --token "$TOKEN" --sessions 4 --secs 3 --warmup-secs 1 >/dev/null
  before="$(calls "$ADMIN_PORT")"
  callgrind_control -i on "$SERVER_PID" >/dev/null 2>&1
  "$BENCH" --url "$MCP_URL" --token "$TOKEN" --sessions 4 --secs "$SECS" --warmup-secs 0 >/dev/null
  callgrind_control -i off "$SERVER_PID" >/dev/null 2>&1
  after="$(calls "$ADMIN_PORT")"
  callgrind_control -d "$SERVER_PID" >/dev/null 2>&1
  sleep 2
  ir="$(cat "$TMP"/cg.* | awk '/^totals:/ { s += $2 } /^summary:/ { t += $2 } END { print (s ? s : t) }')"
  echo "| $bin | $((after - before)) | $(( ir / (after - before) )) |"
  if [[ -n "${KEEP:-}" ]]; then mkdir -p "$KEEP" && cat "$TMP"/cg.*.* >"$KEEP/$(basename "$bin").callgrind"; fi
  pkill -f "valgrind.*$TMP" || true
  sleep 1
  rm -f "$TMP"/cg.*
  hot_path_stop
done
