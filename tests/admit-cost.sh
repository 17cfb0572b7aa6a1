#!/usr/bin/env bash
# Redis's instructions per admission, counted by valgrind's callgrind on redis-server itself (stable on a noisy
# machine, where Redis's CPU time is not), and what each part of admit.lua adds: redis-benchmark replays the full
# stack's steady-state EVALSHA (16 clients: a touch of a live session, the bucket, an in-flight slot over 8 tokens
# with one released, a quota window), then again with one part switched off by its argument; a part's cost is the
# difference. "fixed" is the script with every part off (the EVALSHA, its arguments, TIME, the reply); "no session"
# is a whole admission of a request without a session (the 2026-07-28 generation's), with its three keys; "batch
# of B" is each admission's share of one call carrying B of one principal's (issue 32: B touches of B sessions,
# each with its slot and a release; B=4 by default).
#
#   tests/admit-cost.sh                                   # this tree's admit.lua
#   tests/admit-cost.sh /tmp/admit-a.lua /tmp/admit-b.lua # variants side by side (this tree's argument layout)
#   B=8 tests/admit-cost.sh
# The touch is a 'tap': a replica's steady state, which keeps the session's fixed fields itself. Scripts older than
# the batch (issue 32, second session) take another layout: run that commit's own tests/admit-cost.sh on them.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -gt 0 ]] || set -- crates/state/src/redis/admit.lua
N="${N:-10000}"
B="${B:-4}"
TMP="$(mktemp -d)"
. tests/hot-path.sh # free_port
port="$(free_port)"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/cg.%p" \
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null 2>&1 &
VG=$!
trap 'kill $VG 2>/dev/null || true; wait $VG 2>/dev/null || true; rm -rf "$TMP"' EXIT
R=(redis-cli -p "$port")
for _ in $(seq 100); do "${R[@]}" ping >/dev/null 2>&1 && break; sleep 0.2; done
P='<p>{u:bench}'
# An empty Redis but for a live session with most of its idle TTL left: a touch reads it and writes nothing. Each
# script starts from it, so variants that lay their keys out differently do not meet each other's.
fresh() {
  "${R[@]}" flushall >/dev/null
  for i in $(seq "$B"); do
    "${R[@]}" hset "$P:s:sid$i" ttl 3600000 pv 2025-11-25 caps '{"roots":{}}' >/dev/null
    "${R[@]}" pexpire "$P:s:sid$i" 3800000 >/dev/null
  done
}

# Instructions per call of `redis-benchmark ARGS...` (after an unmeasured warm-up).
cost() {
  # -r: the range of __rand_int__ (slot tokens cycle over 8; with R_WIDE, DPoP proofs are new every time).
  local r=8
  [[ -n "${R_WIDE:-}" ]] && r=1000000000
  redis-benchmark -p "$port" -n 1000 -c 16 -r "$r" -q "$@" >/dev/null
  callgrind_control -z "$VG" >/dev/null 2>&1
  callgrind_control -i on "$VG" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$N" -c 16 -r "$r" -q "$@" >/dev/null
  callgrind_control -i off "$VG" >/dev/null 2>&1
  callgrind_control -d "$VG" >/dev/null 2>&1
  sleep 0.5
  local ir
  ir="$(cat "$TMP"/cg.*.* | awk '/^totals:/ { s += $2 } /^summary:/ { t += $2 } END { print (s ? s : t) }')"
  rm -f "$TMP"/cg.*.*
  echo $((ir / N))
}

echo "| script | admission | bucket | touch | slot | window | release | fixed | no session | batch of $B, each | DPoP proof |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
shared=(1000000 1000000 100000 300000 1000000000 3600000 -)
for f in "$@"; do
  fresh
  sha="$("${R[@]}" script load "$(cat "$f")")"
  # KEYS: bucket, slot set, window, the revocations, the session index, the session's three. ARGV: capacity,
  # per_second, slot cap, slot ttl, window limit, window ms, the token's revocation field ('-'), 1 admission: op,
  # session id, slot token; then the release.
  keys=(8 "$P:tb" "$P:cc" "$P:q:t" "$P:rv" "$P:ss" "$P:s:sid1" "$P:ev:sid1" "$P:ls:sid1")
  run() { cost evalsha "$sha" "${keys[@]}" "$@"; }
  all=$(run 1000000 1000000 100000 300000 1000000000 3600000 - 1 tap sid1 t__rand_int__ t__rand_int__)
  bucket=$(run '' '' 100000 300000 1000000000 3600000 - 1 tap sid1 t__rand_int__ t__rand_int__)
  touch=$(run 1000000 1000000 100000 300000 1000000000 3600000 - 1 '' sid1 t__rand_int__ t__rand_int__)
  slot=$(run 1000000 1000000 '' 300000 1000000000 3600000 - 1 tap sid1 '' t__rand_int__)
  window=$(run 1000000 1000000 100000 300000 '' 3600000 - 1 tap sid1 t__rand_int__ t__rand_int__)
  release=$(run 1000000 1000000 100000 300000 1000000000 3600000 - 1 tap sid1 t__rand_int__)
  fixed=$(run '' '' '' 300000 '' 3600000 - 1 '' sid1 '')
  # A request without a session (every 2026-07-28 one): the bucket, slot, window and release, and four keys only.
  none=$(cost evalsha "$sha" 4 "${keys[@]:1:4}" "${shared[@]}" 1 '' '' t__rand_int__ t__rand_int__)
  # A DPoP proof (issue 36): its replay key after the session's, and '1:<ms>' as the count. Measured against the
  # same admission without one, both without the slot, each request's proof new (a wide -r): what the proof adds.
  plain=$(R_WIDE=1 run 1000000 1000000 '' 300000 1000000000 3600000 - 1 tap sid1 '' '')
  pkeys=(9 "$P:tb" "$P:cc" "$P:q:t" "$P:rv" "$P:ss" "$P:s:sid1" "$P:ev:sid1" "$P:ls:sid1" "$P:dp:p__rand_int__")
  proof=$(R_WIDE=1 cost evalsha "$sha" "${pkeys[@]}" 1000000 1000000 '' 300000 1000000000 3600000 - 1:65000 tap sid1 '' '')
  # B touches of B sessions in one call, each with its slot; B releases ride along.
  bkeys=("$P:tb" "$P:cc" "$P:q:t" "$P:rv" "$P:ss")
  bargs=()
  brel=()
  for i in $(seq "$B"); do
    bkeys+=("$P:s:sid$i" "$P:ev:sid$i" "$P:ls:sid$i")
    bargs+=(tap "sid$i" "t__rand_int__$i")
    brel+=("t__rand_int__$i")
  done
  batch=$(cost evalsha "$sha" "${#bkeys[@]}" "${bkeys[@]}" "${shared[@]}" "$B" "${bargs[@]}" "${brel[@]}")
  echo "| $f | $all | $((all - bucket)) | $((all - touch)) | $((all - slot)) | $((all - window)) | $((all - release)) | $fixed | $none | $((batch / B)) | $((proof - plain)) |"
done
