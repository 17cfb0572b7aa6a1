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
#   tests/callgrind.sh rmcp             # rmcp 3.11's own server (crates/rmcp-baseline), the yardstick of issue 32
#   HOT_PATH_SETUP=bare tests/callgrind.sh   # less of the stack: in-memory or bare (tests/hot-path.sh)
# The ladder of issue 32 (what each part of the full stack adds, in instructions; cost.sh's SET=ladder in CPU time):
#   tests/callgrind.sh rmcp; for s in bare in-memory full; do HOT_PATH_SETUP=$s tests/callgrind.sh; done
# Calls are counted by the load generator (the calls answered in the counted window), for rmcp's server as for ours.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${SECS:-10}"
cargo build --release -q -p mcpfleet -p mcpfleet-loadgen -p mcpfleet-rmcp-baseline
BENCH=target/release/mcpfleet-bench
[[ $# -gt 0 ]] || set -- target/release/mcpfleet

TMP="$(mktemp -d)"
. tests/hot-path.sh
cleanup() { pkill -f "valgrind.*$TMP" 2>/dev/null || true; hot_path_stop; rm -rf "$TMP"; }
trap cleanup EXIT

# rmcp_under WRAPPER...: rmcp's server under the wrapper, as hot_path_start starts ours (SERVER_PID, MCP_URL).
rmcp_under() {
  rm -f "$TMP/out"
  "$@" target/release/rmcp-baseline 127.0.0.1:0 >"$TMP/out" 2>"$TMP/err" &
  SERVER_PID=$!
  for _ in $(seq 600); do grep -q '^listening on ' "$TMP/out" 2>/dev/null && break; sleep 0.1; done
  MCP_URL="http://$(sed -n 's/^listening on //p' "$TMP/out")/mcp"
  TOKEN=""
}

echo "| binary | calls counted | instructions per call |"
echo "|---|---|---|"
for bin in "$@"; do
  wrapper=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/cg.%p")
  if [[ "$bin" == rmcp ]]; then rmcp_under "${wrapper[@]}"; else hot_path_start "$bin" "${wrapper[@]}"; fi
  auth=()
  [[ -n "$TOKEN" ]] && auth=(--token "$TOKEN")
  # Warm-up (caches, the token's verdict, lazy statics), then count a fixed load.
  "$BENCH" --url "$MCP_URL" "${auth[@]}" --sessions 4 --secs 3 --warmup-secs 1 >/dev/null
  callgrind_control -i on "$SERVER_PID" >/dev/null 2>&1
  calls="$("$BENCH" --url "$MCP_URL" "${auth[@]}" --sessions 4 --secs "$SECS" --warmup-secs 0 --json |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["ok"]))')"
  callgrind_control -i off "$SERVER_PID" >/dev/null 2>&1
  callgrind_control -d "$SERVER_PID" >/dev/null 2>&1
  sleep 2
  ir="$(cat "$TMP"/cg.* | awk '/^totals:/ { s += $2 } /^summary:/ { t += $2 } END { print (s ? s : t) }')"
  label="$bin"
  [[ "$bin" != rmcp ]] && label="$bin (${HOT_PATH_SETUP:-full})"
  echo "| $label | $calls | $(( ir / calls )) |"
  if [[ -n "${KEEP:-}" ]]; then mkdir -p "$KEEP" && cat "$TMP"/cg.*.* >"$KEEP/$(basename "$bin").callgrind"; fi
  pkill -f "valgrind.*$TMP" || true
  sleep 1
  rm -f "$TMP"/cg.*
  hot_path_stop
done
