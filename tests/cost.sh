#!/usr/bin/env bash
# Cost per call, side by side (issue 32): CPU per tools/call on each side — rmcp's own server, the replica(s), Redis
# — measured in alternating pairs in one run, with the ratios the targets are stated in, and their medians.
#
#   tests/cost.sh                       # 5 pairs, 8 s per setup, 16 sessions
#   PAIRS=7 SECS=10 tests/cost.sh
#   ROWS=/tmp/rows.jsonl tests/cost.sh  # also keeps every run's raw figures (mcpfleet-bench --json), one per line
#   BASE_BIN=/tmp/mcpfleet-old tests/cost.sh   # each pair also runs "1 replica" and "3 replicas" with that binary
#   SET=realistic tests/cost.sh         # the realistic work instead (issue 32, target 4; below)
#   SET=ladder tests/cost.sh            # where the replica's CPU per call goes, part by part (below)
#   SET=policy tests/cost.sh            # a policy of three plans against the flags alone (issue 34; below)
#   SET=downstreams tests/cost.sh       # --downstreams configured, calls that never ask, against none (issue 35)
#   SET=dpop tests/cost.sh              # DPoP-bound tokens with a proof per call, against bearer tokens (issue 36)
#
# Each pair runs every setup once, in turn; the order flips from one pair to the next, so that a drift of the
# machine during the run falls on both sides. The setups, all on the trivial tool (test_simple_text):
#   rmcp        rmcp 3.11's Streamable HTTP server (crates/rmcp-baseline): in-process sessions, no auth, no store
#   1 replica   Redis, JWT (--auth dev, verified and cached per token), the bucket, the in-flight cap and a quota on
#               the tool, all in force and out of the one principal's reach
#   1 + audit   the same, with the audit trail on PostgreSQL
#   3 replicas  the first, three times, requests round-robin over them
#   3 replicas, 1 worker each   the same, each replica with --worker-threads 1: its share of the two cores, as the
#               chart sizes it from requests.cpu (three replicas of two workers each are six on two cores)
# The report (tests/cost-report.py) gives each pair's figures and the medians of the ratios, per pair:
#   1. replica CPU / rmcp server CPU          target <= 0.8 (<= 1.0 with the audit trail)
#   2. Redis CPU per call                     target <= 0.010 ms
#   3. 3 replicas' CPU / 1 replica's, a call  target <= 1.2
# CPU is user + system time from /proc (the replicas summed), and Redis's from INFO cpu, over the measured window.
# Calls/s is printed, never targeted: on two shared cores the load generator, Redis and PostgreSQL share the CPU.
#
# SET=realistic: each workload below on rmcp's server and on one replica with the full stack (the "1 replica" setup,
# the workload's tool under a quota too), in alternating pairs as above; no PostgreSQL. The report is a table of
# CPU per op on each side (medians), Redis's, and the replica / rmcp ratio (the median of the per-pair ratios).
# One op is one iteration of the load generator's loop (mcpfleet-bench --op ...), which checks every answer:
#   progress   tools/call of bench_progress with a progressToken: 5 progress notifications over SSE, then the answer
#   blob       tools/call of bench_blob: one text block of 65 536 bytes
#   stateless  the 2026-07-28 call of test_simple_text: no session, the version and method in headers and _meta;
#              rmcp's server runs with --stateless (no session mode, a JSON answer)
#   resume     the progress call read to its end, then a GET with Last-Event-ID set to its first (priming) event's id,
#              read to its end: the same messages replayed; one op is both requests. Replica only: rmcp 3.11's
#              LocalSessionManager drops a request's stream and its cached events once the response is sent
#   task       (2026-07-28) slow_job of 0 s, always a task: created, then polled with tasks/get with no pause until
#              completed (that answer carries the result); one op is the creation and every poll. rmcp: its
#              TaskManager, in process (--stateless)
# BASE_BIN does not apply to this set.
#
# SET=ladder: the trivial tool on rmcp's server and on one replica, with the full stack's parts added one by one, so
# that each step's CPU per call is the cost of what it adds (the report: each setup's median replica / rmcp ratio,
# and each step's median difference in ms a call, both taken within each pair; no PostgreSQL):
#   rmcp                          as above
#   in-memory, no auth            the embedded store, no identity; the bucket (out of reach) as every replica has it
#   in-memory, JWT and limits     + JWT, the in-flight cap and the quota: the full stack's work, without Redis
#   1 replica                     + Redis: the full stack (one admit.lua round trip a call, shared by a batch)
# BASE_BIN does not apply to this set.
#
# SET=policy (issue 34): one replica with the full stack ("1 replica" above) on the flags alone, against the same
# with a policy of three plans in force (applied with `mcpfleet policy apply` under a Redis prefix of its own): the
# token's plan assigned by CEL rules at verification, the plan's numbers (the flags', out of reach) in the admission,
# a CEL condition on the tool's every call, and three other principals revoked (the admission reads the
# revocations in its round trip either way). The report: the per-pair ratios of replica and Redis CPU per call.
# BASE_BIN does not apply to this set.
#
# SET=downstreams (issue 35): the same replica with `--downstreams` (an exchange downstream and a URL-mode one, the
# caller's token carried to every call's context) against none, for calls whose tool never asks for a downstream
# token: what configuring downstreams costs the calls that do not use them. BASE_BIN does not apply to this set.
#
# SET=dpop (issue 36): the same replica with `--dpop require`, the load generator signing a fresh ES256 proof per
# call (the committed test key crates/testkit/keys/ec-1) for a token bound to it, against bearer tokens: what a
# proof costs the replica (one signature check per call; the token's verdict stays cached) and Redis (its replay
# record in the same admission). BASE_BIN does not apply to this set.
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS="${PAIRS:-5}"
SECS="${SECS:-8}"
SESSIONS="${SESSIONS:-16}"
LOG="${LOG:-info}"
SET="${SET:-trivial}"
[[ "$SET" == trivial || "$SET" == realistic || "$SET" == ladder || "$SET" == policy || "$SET" == downstreams ||
  "$SET" == dpop ]] ||
  { echo "SET is trivial, realistic, ladder, policy, downstreams or dpop, not $SET" >&2; exit 64; }

. tests/bench-lib.sh
bench_setup
trap 'bench_stop_all; rm -rf "$TMP"' EXIT
bench_redis_start
[[ "$SET" == trivial ]] && bench_postgres_start "$BIN"
KEY="$TMP/dev-key.pem"
export MCPFLEET_REQUEST_STATE_KEYS="bench:$(head -c 32 /dev/urandom | base64 -w0)"
TOKEN="$("$BIN" token --dev-key-file "$KEY" --sub bench --scope mcp:access --ttl 1h)"
LIMITS=(--auth dev --dev-key-file "$KEY" --max-inflight-per-user 100000 --quota test_simple_text=1000000000/1h)
# SET=dpop: a token bound to the committed P-256 test key, whose proofs the load generator signs.
DPOP_KEY=crates/testkit/keys/ec-1.pem
DPOP_JWK=crates/testkit/keys/ec-1.jwk.json
if [[ "$SET" == dpop ]]; then
  JKT="$(python3 -c 'import base64,hashlib,json,sys; j=json.load(open(sys.argv[1])); c=json.dumps({k: j[k] for k in ("crv","kty","x","y")}, separators=(",",":"), sort_keys=True); print(base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).decode().rstrip("="))' "$DPOP_JWK")"
  DPOP_TOKEN="$("$BIN" token --dev-key-file "$KEY" --sub bench --scope mcp:access --ttl 1h --dpop-jkt "$JKT")"
fi
FULL=(--redis-url "$REDIS_URL" "${LIMITS[@]}")
ROWS="${ROWS:-$TMP/rows.jsonl}"
: >"$ROWS"

# SET=policy: three plans, the bench principal on the default one with the flags' numbers and a condition on the
# tool; applied, with three revocations, under a prefix of its own (the flags' runs must not follow it).
if [[ "$SET" == policy ]]; then
  cat >"$TMP/policy.yaml" <<'YAML'
plans:
  free:
    inflight: 100000
    quotas: { test_simple_text: { limit: 1000000000, window: 1h } }
    tools:
      conditions:
        - tool: test_simple_text
          when: 'principal.subject != "blocked"'
          message: 'blocked'
  pro:
    inflight: 100000
    rate: { per_second: 1000, burst: 2000 }
  enterprise:
    inflight: 100000
    sessions: 1000
assign:
  - when: 'principal.claims.plan == "enterprise"'
    plan: enterprise
  - when: 'principal.claims.plan == "pro" && principal.issuer == "urn:mcpfleet:dev"'
    plan: pro
default: free
YAML
  "$BIN" policy apply "$TMP/policy.yaml" --redis-url "$REDIS_URL" --redis-prefix pol: --by bench >&2
  for who in mallory trudy eve; do
    "$BIN" revoke --sub "$who" --iss urn:mcpfleet:dev --redis-url "$REDIS_URL" --redis-prefix pol: --by bench >&2
  done
fi

# SET=downstreams: a document with an exchange downstream and a URL-mode one (nothing listens at their endpoints:
# the bench's tool never asks), its secret in the environment, a key ring for the URL-mode grants.
if [[ "$SET" == downstreams ]]; then
  cat >"$TMP/downstreams.yaml" <<'YAML'
downstreams:
  calendar:
    base_url: http://127.0.0.1:9/api/
    exchange:
      token_endpoint: http://127.0.0.1:9/token
      client: { id: bench, auth: client_secret_basic, secret: { env: BENCH_DOWNSTREAM_SECRET } }
      audience: https://calendar.bench
  forge:
    base_url: http://127.0.0.1:9/
    authorization_code:
      authorization_endpoint: http://127.0.0.1:9/auth
      token_endpoint: http://127.0.0.1:9/token
      client: { id: bench, auth: client_secret_post, secret: { env: BENCH_DOWNSTREAM_SECRET } }
YAML
  export BENCH_DOWNSTREAM_SECRET=bench-secret
  DOWNSTREAMS=(--downstreams "$TMP/downstreams.yaml" --downstream-key "bench:$(head -c 32 /dev/urandom | base64 -w0)")
fi

# The realistic set: the workloads, and the load generator's flags for each.
WORKLOADS=(progress blob stateless resume task)
FULL_REALISTIC=("${FULL[@]}" --quota bench_progress=1000000000/1h --quota bench_blob=1000000000/1h
  --quota slow_job=1000000000/1h)
workload_args() {
  case "$1" in
    progress) echo --op progress ;;
    blob) echo --op blob ;;
    stateless) echo --generation 2026 ;;
    resume) echo --op resume ;;
    task) echo --op task --generation 2026 ;;
  esac
}

# measure_work PAIR "WORKLOAD: SIDE": one run of a workload of the realistic set on rmcp or on one replica.
measure_work() {
  local pair="$1" setup="$2" workload="${2%%: *}" args=() row
  read -r -a args <<<"$(workload_args "$workload")"
  if [[ "$setup" == *": rmcp" ]]; then
    if [[ "$workload" == stateless || "$workload" == task ]]; then rmcp_start --stateless; else rmcp_start; fi
    args+=(--url "$RMCP_URL" --pid "$RMCP_PID")
  else
    start_replica "${FULL_REALISTIC[@]}"
    args+=(--url "${URLS[0]}" --pid "${PIDS[0]}" --token "$TOKEN" --redis-url "$REDIS_URL")
  fi
  row="$("$BENCH" "${args[@]}" --sessions "$SESSIONS" --secs "$SECS" --label "$setup" --json)"
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.update(pair=int(sys.argv[2]), pg_cpu_ms=0); print(json.dumps(r))' \
    "$row" "$pair" >>"$ROWS"
  if [[ "$setup" == *": rmcp" ]]; then rmcp_stop; else stop_replicas; fi
}

# measure PAIR SETUP: one run of SETUP, its figures appended to ROWS.
measure() {
  local pair="$1" setup="$2" args=() pg_before
  [[ "$setup" == *"[base]" ]] && SERVER_BIN="$BASE_BIN"
  case "$setup" in
    rmcp)
      rmcp_start
      args=(--url "$RMCP_URL" --pid "$RMCP_PID") ;;
    "1 replica, 3-plan policy") start_replica "${FULL[@]}" --redis-prefix pol: ;;
    "1 replica, downstreams") start_replica "${FULL[@]}" "${DOWNSTREAMS[@]}" ;;
    "1 replica, DPoP") start_replica "${FULL[@]}" --dpop require ;;
    "1 replica"*) start_replica "${FULL[@]}" ;;
    "in-memory, no auth") start_replica ;;
    "in-memory, JWT and limits") start_replica "${LIMITS[@]}" ;;
    "1 + audit") start_replica "${FULL[@]}" --database-url "$DB_URL" ;;
    "3 replicas, 1 worker each") for _ in 1 2 3; do start_replica "${FULL[@]}" --worker-threads 1; done ;;
    "3 replicas"*) for _ in 1 2 3; do start_replica "${FULL[@]}"; done ;;
  esac
  if [[ "$setup" != rmcp ]]; then
    for u in "${URLS[@]}"; do args+=(--url "$u"); done
    for p in "${PIDS[@]}"; do args+=(--pid "$p"); done
    if [[ "$setup" == "1 replica, DPoP" ]]; then
      args+=(--token "$DPOP_TOKEN" --dpop-key "$DPOP_KEY" --dpop-jwk "$DPOP_JWK")
    elif [[ "$setup" != "in-memory, no auth" ]]; then
      args+=(--token "$TOKEN")
    fi
    [[ "$setup" != in-memory* ]] && args+=(--redis-url "$REDIS_URL")
  fi
  SERVER_BIN=""
  pg_before="$(pg_cpu_ms)"
  local row
  row="$("$BENCH" "${args[@]}" --sessions "$SESSIONS" --secs "$SECS" --label "$setup" --json)"
  # PostgreSQL's CPU over the run (warm-up included), read once the run is over.
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.update(pair=int(sys.argv[2]), pg_cpu_ms=int(sys.argv[3])); print(json.dumps(r))' \
    "$row" "$pair" "$(( $(pg_cpu_ms) - pg_before ))" >>"$ROWS"
  if [[ "$setup" == rmcp ]]; then rmcp_stop; else stop_replicas; fi
}

SETUPS=("rmcp" "1 replica" "1 + audit" "3 replicas" "3 replicas, 1 worker each")
# With a base binary, each base run sits next to the same setup of this tree, so that the two swap places from one
# pair to the next (a run after three replicas stopped can be slower than one after rmcp).
[[ -n "${BASE_BIN:-}" ]] && SETUPS=("rmcp" "1 replica" "1 replica [base]" "1 + audit" "3 replicas" "3 replicas [base]"
  "3 replicas, 1 worker each")
MEASURE=measure
if [[ "$SET" == realistic ]]; then
  SETUPS=()
  for w in "${WORKLOADS[@]}"; do
    [[ "$w" != resume ]] && SETUPS+=("$w: rmcp")
    SETUPS+=("$w: 1 replica")
  done
  MEASURE=measure_work
fi
[[ "$SET" == ladder ]] && SETUPS=("rmcp" "in-memory, no auth" "in-memory, JWT and limits" "1 replica")
[[ "$SET" == policy ]] && SETUPS=("1 replica, flags" "1 replica, 3-plan policy")
[[ "$SET" == downstreams ]] && SETUPS=("1 replica, flags" "1 replica, downstreams")
[[ "$SET" == dpop ]] && SETUPS=("1 replica, flags" "1 replica, DPoP")
what=test_simple_text
[[ "$SET" == realistic ]] && what="the realistic set (${WORKLOADS[*]})"
[[ "$SET" == ladder ]] && what="test_simple_text, the full stack part by part"
[[ "$SET" == policy ]] && what="test_simple_text, the flags against a policy of three plans"
[[ "$SET" == downstreams ]] && what="test_simple_text, without and with --downstreams (never asked)"
[[ "$SET" == dpop ]] && what="test_simple_text, bearer tokens against DPoP-bound ones with a proof per call"
echo "cost per call: $PAIRS pairs, ${SECS} s per setup, $SESSIONS sessions, $what, log level $LOG, $(nproc) cores" >&2
for pair in $(seq "$PAIRS"); do
  order=("${SETUPS[@]}")
  if (( pair % 2 == 0 )); then
    order=()
    for (( k = ${#SETUPS[@]} - 1; k >= 0; k-- )); do order+=("${SETUPS[k]}"); done
  fi
  for setup in "${order[@]}"; do
    echo "pair $pair: $setup" >&2
    "$MEASURE" "$pair" "$setup"
  done
done
case "$SET" in
  realistic) python3 tests/cost-report.py --realistic "$ROWS" ;;
  ladder) python3 tests/cost-report.py --ladder "$ROWS" ;;
  policy) python3 tests/cost-report.py --policy "$ROWS" ;;
  downstreams) python3 tests/cost-report.py --downstreams "$ROWS" ;;
  dpop) python3 tests/cost-report.py --dpop "$ROWS" ;;
  *) python3 tests/cost-report.py "$ROWS" ;;
esac
