#!/usr/bin/env bash
# Manual interop run (not used by CI; tests/interop.rs is the harness): starts its own redis-server, 3 replicas
# of target/debug/mcpfleet with the conformance fixtures and the round-robin proxy rr_proxy.py in front, runs
# workflow.py (or, with --oauth, oauth.py against replicas started with --auth dev) with every SDK venv and
# generation, then stops everything it started.
#
#   tests/interop/python/run_local.sh                  # the three workflow runs through the fleet
#   tests/interop/python/run_local.sh --oauth          # the three oauth.py runs through a --auth dev fleet
#   tests/interop/python/run_local.sh --single         # against one replica on the in-memory store instead
#   EXTRA_SERVE_ARGS="--rate-burst 0" tests/interop/python/run_local.sh
#
# Needs tests/interop/python/install.sh to have run, and a built binary (cargo build -p mcpfleet --bin mcpfleet).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
HERE="$ROOT/tests/interop/python"
BIN="$ROOT/target/debug/mcpfleet"
MODE=fleet
SCRIPT=workflow.py
for arg in "$@"; do
  case "$arg" in
    --single) MODE=single ;;
    --oauth) SCRIPT=oauth.py ;;
    *) echo "usage: $0 [--single] [--oauth]" >&2; exit 2 ;;
  esac
done
WORK="$(mktemp -d)"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "run_local.sh: nothing listens on $1" >&2; return 1
}

# shellcheck disable=SC2206
EXTRA=(${EXTRA_SERVE_ARGS:-})
if [ "$SCRIPT" = oauth.py ]; then
  # Every replica signs and verifies with the same dev key, as a dev fleet must.
  EXTRA+=(--auth dev --dev-key-file "$WORK/dev.key")
fi
if [ "$MODE" = single ]; then
  P=$(free_port)
  "$BIN" serve --fixtures conformance --listen "127.0.0.1:$P" --admin-listen "127.0.0.1:$(free_port)" \
    "${EXTRA[@]}" >"$WORK/r0.log" 2>&1 &
  PIDS+=($!)
  wait_port "$P"
  URL="http://127.0.0.1:$P/mcp"
else
  RP=$(free_port)
  redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
  PIDS+=($!)
  wait_port "$RP"
  KEY="fleet:dGVzdC1mbGVldC1yZXF1ZXN0LXN0YXRlLWtleS0wMTIzNDU2Nzg5YWI="
  BACKENDS=()
  for i in 0 1 2; do
    P=$(free_port)
    "$BIN" serve --fixtures conformance --listen "127.0.0.1:$P" --admin-listen "127.0.0.1:$(free_port)" \
      --redis-url "redis://127.0.0.1:$RP" --replicas 3 --request-state-key "$KEY" \
      "${EXTRA[@]}" >"$WORK/r$i.log" 2>&1 &
    PIDS+=($!)
    BACKENDS+=(--backend "127.0.0.1:$P")
    wait_port "$P"
  done
  PP=$(free_port)
  python3 "$HERE/rr_proxy.py" --listen "127.0.0.1:$PP" "${BACKENDS[@]}" 2>"$WORK/proxy.log" &
  PIDS+=($!)
  wait_port "$PP"
  URL="http://127.0.0.1:$PP/mcp"
fi

status=0
for run in "venv-mcp1 2025" "venv-mcp2 2025" "venv-mcp2 2026"; do
  set -- $run
  echo "== $SCRIPT: $1 --generation $2 ($URL)"
  start=$(date +%s.%N)
  if "$ROOT/.tools/$1/bin/python" "$HERE/$SCRIPT" --url "$URL" --generation "$2"; then
    awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "   ok in %.1f s\n", e - s }'
  else
    echo "   FAILED"; status=1
  fi
done
if [ "$status" != 0 ]; then
  for f in "$WORK"/r*.log; do echo "--- $f (tail)"; tail -20 "$f"; done
fi
exit "$status"
