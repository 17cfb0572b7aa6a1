#!/usr/bin/env bash
# How cost grows (issue 32, target 5): the trivial tool's cost per call, its latency and what Redis and the replica
# hold, with a population of idle sessions, then of open SSE streams, kept open through the load; and what open
# streams cost at rest (their lease renewals), per stream per second.
#
#   tests/growth.sh                                  # sessions 0 1k 10k 100k, streams 100 1k 10k
#   SESSIONS_AT="0 1000 10000" STREAMS_AT="100 1000" SECS=4 tests/growth.sh
#   OUT=docs/growth tests/growth.sh                  # where growth.jsonl, growth.csv and growth.svg go
#
# One replica (--auth dev, the bucket, the in-flight cap and a quota on the tool in force and out of reach; the
# per-user session and stream caps off, so that one principal holds the whole population: the session index is
# then not kept, see docs/ARCHITECTURE.md), one Redis of its own, emptied before each point. At each point the
# load generator opens the population (the official TypeScript SDK's initialize), waits IDLE seconds with no other
# traffic (the population's own cost at rest), then runs 16 sessions of tools/call for SECS seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
SESSIONS_AT="${SESSIONS_AT:-0 1000 10000 100000}"
STREAMS_AT="${STREAMS_AT:-100 1000 10000}"
SECS="${SECS:-6}"
IDLE="${IDLE:-10}"
LOAD_SESSIONS="${LOAD_SESSIONS:-16}"
OUT="${OUT:-docs/growth}"
LOG="${LOG:-info}"

. tests/bench-lib.sh
bench_setup
trap 'bench_stop_all; rm -rf "$TMP"' EXIT
# 10 000 streams are 10 000 connections on each side, and the load's on top.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
bench_redis_start
KEY="$TMP/dev-key.pem"
export MCPFLEET_REQUEST_STATE_KEYS="bench:$(head -c 32 /dev/urandom | base64 -w0)"
TOKEN="$("$BIN" token --dev-key-file "$KEY" --sub bench --scope mcp:access --ttl 2h)"
FULL=(--redis-url "$REDIS_URL" --auth dev --dev-key-file "$KEY" --max-inflight-per-user 100000
  --quota test_simple_text=1000000000/1h --max-streams-per-user 0)
mkdir -p "$OUT"
ROWS="$OUT/growth.jsonl"
: >"$ROWS"

# point KIND N: one replica on an emptied Redis, N idle sessions or N streams, the load; both rows to ROWS.
point() {
  local kind="$1" n="$2" pop=()
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  start_replica "${FULL[@]}"
  case "$kind" in
    sessions) pop=(--background-sessions "$n") ;;
    streams) pop=(--background-streams "$n") ;;
  esac
  echo "$kind $n" >&2
  "$BENCH" --url "${URLS[0]}" --pid "${PIDS[0]}" --token "$TOKEN" --redis-url "$REDIS_URL" "${pop[@]}" \
    --idle-secs "$IDLE" --sessions "$LOAD_SESSIONS" --secs "$SECS" --label "$kind $n" --json |
    python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l); r.update(kind=sys.argv[1], n=int(sys.argv[2])); print(json.dumps(r))' "$kind" "$n" >>"$ROWS"
  stop_replicas
}

for n in $SESSIONS_AT; do point sessions "$n"; done
for n in $STREAMS_AT; do point streams "$n"; done
python3 tests/growth-report.py "$ROWS" "$OUT"
