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
cleanup() { pkill -f "valgrind.*$TMP" 2>/dev/null || true; [[ -n "${REDIS_PID:-}" ]] && kill "$REDIS_PID" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
calls() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^mcp_tool_calls_total\{.*outcome="ok"/ { s += $2 } END { print s + 0 }'; }

export MCPFLEET_REQUEST_STATE_KEYS="bench:$(head -c 32 /dev/urandom | base64 -w0)"
echo "| binary | calls counted | instructions per call |"
echo "|---|---|---|"
for bin in "$@"; do
  port="$(free_port)"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  token="$("$bin" token --dev-key-file "$TMP/key.pem" --sub bench --scope mcp:access --ttl 1h)"
  mcp="$(free_port)" admin="$(free_port)"
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/cg.%p" \
    "$bin" serve --listen "127.0.0.1:$mcp" --admin-listen "127.0.0.1:$admin" --fixtures conformance \
    --redis-url "redis://127.0.0.1:$port" --auth dev --dev-key-file "$TMP/key.pem" --log info \
    --rate-burst 1000000 --rate-per-second 1000000 --max-sessions-per-user 0 --max-inflight-per-user 100000 \
    --quota test_simple_text=1000000000/1h >"$TMP/out" 2>"$TMP/err" &
  for _ in $(seq 600); do grep -q '^admin listening on ' "$TMP/out" 2>/dev/null && break; sleep 0.1; done
  # Warm-up (caches, the token's verdict, lazy statics), then count a fixed load.
  "$BENCH" --url "http://127.0.0.1:$mcp/mcp" --token "$token" --sessions 4 --secs 3 --warmup-secs 1 >/dev/null
  before="$(calls "$admin")"
  callgrind_control -i on >/dev/null 2>&1
  "$BENCH" --url "http://127.0.0.1:$mcp/mcp" --token "$token" --sessions 4 --secs "$SECS" --warmup-secs 0 >/dev/null
  callgrind_control -i off >/dev/null 2>&1
  after="$(calls "$admin")"
  callgrind_control -d >/dev/null 2>&1
  sleep 2
  ir="$(cat "$TMP"/cg.* | awk '/^totals:/ { s += $2 } /^summary:/ { t += $2 } END { print (s ? s : t) }')"
  echo "| $bin | $((after - before)) | $(( ir / (after - before) )) |"
  if [[ -n "${KEEP:-}" ]]; then mkdir -p "$KEEP" && cat "$TMP"/cg.*.* >"$KEEP/$(basename "$bin").callgrind"; fi
  pkill -f "valgrind.*$TMP" || true
  sleep 1
  rm -f "$TMP"/cg.*
  kill "$REDIS_PID" 2>/dev/null || true
  wait "$REDIS_PID" 2>/dev/null || true
done
