#!/usr/bin/env bash
# Redis's instructions per admission, counted by valgrind's callgrind on redis-server itself (stable on a noisy
# machine, where Redis's CPU time is not), and what each part of admit.lua adds: redis-benchmark replays the full
# stack's steady-state EVALSHA (16 clients: a touch of a live session, the bucket, an in-flight slot over 8 tokens
# with one released, a quota window), then again with one part switched off by its argument; a part's cost is the
# difference. "fixed" is the script with every part off (the EVALSHA, its arguments, TIME, the reply); "no session"
# is a whole admission of a request without a session (the 2026-07-28 generation's), with its three keys.
#
#   tests/admit-cost.sh                                   # this tree's admit.lua
#   tests/admit-cost.sh /tmp/admit-a.lua /tmp/admit-b.lua # variants side by side (this tree's argument layout)
#   OP=touch tests/admit-cost.sh OLD.lua NEW.lua           # a script older than 'tap' (issue 32) beside a newer one
# The touch is a 'tap' by default: a replica's steady state, which keeps the session's fixed fields itself.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -gt 0 ]] || set -- crates/state/src/redis/admit.lua
N="${N:-10000}"
OP="${OP:-tap}"
TMP="$(mktemp -d)"
. tests/hot-path.sh # free_port
port="$(free_port)"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/cg.%p" \
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null 2>&1 &
VG=$!
trap 'kill $VG 2>/dev/null || true; wait $VG 2>/dev/null || true; rm -rf "$TMP"' EXIT
R=(redis-cli -p "$port")
for _ in $(seq 100); do "${R[@]}" ping >/dev/null 2>&1 && break; sleep 0.2; done
B='<p>{u:bench}'
# An empty Redis but for a live session with most of its idle TTL left: a touch reads it and writes nothing. Each
# script starts from it, so variants that lay their keys out differently do not meet each other's.
fresh() {
  "${R[@]}" flushall >/dev/null
  "${R[@]}" hset "$B:s:sid1" ttl 3600000 pv 2025-11-25 caps '{"roots":{}}' info '{}' created 0 n 0 >/dev/null
  "${R[@]}" pexpire "$B:s:sid1" 3800000 >/dev/null
}

# Instructions per call of `redis-benchmark ARGS...` (after an unmeasured warm-up).
cost() {
  redis-benchmark -p "$port" -n 1000 -c 16 -r 8 -q "$@" >/dev/null
  callgrind_control -z "$VG" >/dev/null 2>&1
  callgrind_control -i on "$VG" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$N" -c 16 -r 8 -q "$@" >/dev/null
  callgrind_control -i off "$VG" >/dev/null 2>&1
  callgrind_control -d "$VG" >/dev/null 2>&1
  sleep 0.5
  local ir
  ir="$(cat "$TMP"/cg.*.* | awk '/^totals:/ { s += $2 } /^summary:/ { t += $2 } END { print (s ? s : t) }')"
  rm -f "$TMP"/cg.*.*
  echo $((ir / N))
}

echo "| script | admission | bucket | touch | slot | window | release | fixed | no session |"
echo "|---|---|---|---|---|---|---|---|---|"
keys=(7 "$B:tb" "$B:cc" "$B:q:t" "$B:s:sid1" "$B:ev:sid1" "$B:ls:sid1" "$B:ss")
for f in "$@"; do
  fresh
  sha="$("${R[@]}" script load "$(cat "$f")")"
  # ARGV: capacity, per_second, slot cap, slot token, slot ttl, window limit, window ms, op, session id, releases.
  run() { cost evalsha "$sha" "${keys[@]}" "$@"; }
  all=$(run 1000000 1000000 100000 t__rand_int__ 300000 1000000000 3600000 "$OP" sid1 t__rand_int__)
  bucket=$(run '' '' 100000 t__rand_int__ 300000 1000000000 3600000 "$OP" sid1 t__rand_int__)
  touch=$(run 1000000 1000000 100000 t__rand_int__ 300000 1000000000 3600000 '' sid1 t__rand_int__)
  slot=$(run 1000000 1000000 '' t__rand_int__ 300000 1000000000 3600000 "$OP" sid1 t__rand_int__)
  window=$(run 1000000 1000000 100000 t__rand_int__ 300000 '' 3600000 "$OP" sid1 t__rand_int__)
  release=$(run 1000000 1000000 100000 t__rand_int__ 300000 1000000000 3600000 "$OP" sid1)
  fixed=$(run '' '' '' t__rand_int__ 300000 '' 3600000 '' sid1)
  # A request without a session (every 2026-07-28 one): the bucket, slot, window and release, and three keys only.
  none=$(cost evalsha "$sha" 3 "${keys[@]:1:3}" 1000000 1000000 100000 t__rand_int__ 300000 1000000000 3600000 '' - \
    t__rand_int__)
  echo "| $f | $all | $((all - bucket)) | $((all - touch)) | $((all - slot)) | $((all - window)) | $((all - release)) | $fixed | $none |"
done
