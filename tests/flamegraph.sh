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
. tests/hot-path.sh
cleanup() { hot_path_stop; rm -rf "$TMP"; }
trap cleanup EXIT

hot_path_start "$BIN"
pid="$SERVER_PID"
[[ "$WHO" == redis ]] && pid="$REDIS_PID"
"$BENCH" --url "$MCP_URL" --token "$TOKEN" --sessions 16 --secs $((SECS + 3)) --warmup-secs 1 >/dev/null &
bench=$!
sleep 2
perf record -q -F 499 --call-graph dwarf,16384 -p "$pid" -o "$TMP/perf.data" -- sleep "$SECS" >/dev/null 2>&1
wait "$bench"
perf script -i "$TMP/perf.data" 2>/dev/null | inferno-collapse-perf | \
  inferno-flamegraph --title "$(basename "$BIN"): $WHO, full stack tools/call" --minwidth 0.2 >"$OUT"
echo "$OUT"
