#!/usr/bin/env bash
# A flamegraph of where a replica's CPU goes (or its Redis's, WHO=redis) under the full stack's hot path: a Redis
# of its own, one replica with JWT, the bucket, a quota and the in-flight cap in force (no database), 16 sessions
# of mcpfleet-bench, and `perf record --call-graph dwarf` on the process for SECS seconds after a warm-up.
# Needs perf and inferno (`cargo install inferno`: inferno-collapse-perf, inferno-flamegraph) on the PATH.
#
#   tests/flamegraph.sh target/release/mcpfleet /tmp/replica.svg
#   WHO=redis tests/flamegraph.sh target/release/mcpfleet /tmp/redis.svg
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 2 ]] || { echo "usage: $0 BIN OUT.svg" >&2; exit 64; }
BIN="$1" OUT="$2" SECS="${SECS:-5}" WHO="${WHO:-replica}"
cargo build --release -q -p mcpfleet-loadgen
BENCH=target/release/mcpfleet-bench

TMP="$(mktemp -d)"
cleanup() { kill "${SERVER_PID:-}" "${REDIS_PID:-}" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

export MCPFLEET_REQUEST_STATE_KEYS="bench:$(head -c 32 /dev/urandom | base64 -w0)"
port="$(free_port)"
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null 2>&1 &
REDIS_PID=$!
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
token="$("$BIN" token --dev-key-file "$TMP/key.pem" --sub bench --scope mcp:access --ttl 1h)"
mcp="$(free_port)"
"$BIN" serve --listen "127.0.0.1:$mcp" --admin-listen 127.0.0.1:0 --fixtures conformance \
  --redis-url "redis://127.0.0.1:$port" --auth dev --dev-key-file "$TMP/key.pem" --log info \
  --rate-burst 1000000 --rate-per-second 1000000 --max-sessions-per-user 0 --max-inflight-per-user 100000 \
  --quota test_simple_text=1000000000/1h >"$TMP/out" 2>/dev/null &
SERVER_PID=$!
for _ in $(seq 600); do grep -q '^admin listening on ' "$TMP/out" 2>/dev/null && break; sleep 0.1; done
pid="$SERVER_PID"
[[ "$WHO" == redis ]] && pid="$REDIS_PID"
"$BENCH" --url "http://127.0.0.1:$mcp/mcp" --token "$token" --sessions 16 --secs $((SECS + 3)) --warmup-secs 1 \
  >/dev/null &
bench=$!
sleep 2
perf record -q -F 499 --call-graph dwarf,16384 -p "$pid" -o "$TMP/perf.data" -- sleep "$SECS" >/dev/null 2>&1
wait "$bench"
perf script -i "$TMP/perf.data" 2>/dev/null | inferno-collapse-perf | \
  inferno-flamegraph --title "$(basename "$BIN"): $WHO, full stack tools/call" --minwidth 0.2 >"$OUT"
echo "$OUT"
