#!/usr/bin/env bash
# Installs the official Python MCP SDK (`mcp` on PyPI) in two virtual environments under .tools/ at the
# repository root, for the interop workflows in this directory:
#   .tools/venv-mcp1  mcp==1.30.0 (2025 generation only)
#   .tools/venv-mcp2  mcp==2.3.0  (2025 generation and the stateless 2026-07-28 generation)
# Idempotent: a venv whose `mcp` already has the right version is left alone. Quiet; fails loudly.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PYTHON="${PYTHON:-python3}"
start=$(date +%s.%N)

fail() { echo "install.sh: error: $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || fail "$PYTHON not found"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || fail "$PYTHON is $("$PYTHON" -V 2>&1); the mcp SDK needs Python 3.10 or later"

installed_version() { # venv dir -> prints the installed mcp version, or nothing
  [ -x "$1/bin/python" ] || return 0
  "$1/bin/python" - <<'PY' 2>/dev/null || true
from importlib.metadata import version
print(version("mcp"))
PY
}

ensure_venv() { # name version
  local venv="$ROOT/.tools/$1" want="$2" have
  have="$(installed_version "$venv")"
  if [ "$have" = "$want" ]; then
    # Keep the venv out of git, as Python 3.13's venv does by itself.
    [ -f "$venv/.gitignore" ] || echo '*' >"$venv/.gitignore"
    echo "$1: mcp $want already installed"
    return 0
  fi
  if ! "$venv/bin/python" -c '' 2>/dev/null; then
    # Missing, or broken (e.g. made by a Python that is gone): start over.
    rm -rf "$venv"
    mkdir -p "$ROOT/.tools"
    "$PYTHON" -m venv "$venv" || fail "$PYTHON -m venv $venv failed (on Debian: apt-get install python3-venv)"
  fi
  # Keep the venv out of git, as Python 3.13's venv does by itself.
  [ -f "$venv/.gitignore" ] || echo '*' >"$venv/.gitignore"
  local log; log="$(mktemp)"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "mcp==$want" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    fail "pip install mcp==$want into $venv failed"
  fi
  rm -f "$log"
  have="$(installed_version "$venv")"
  [ "$have" = "$want" ] || fail "$venv has mcp '${have:-none}' after installing $want"
  echo "$1: installed mcp $want"
}

# Both at once: pip spends most of its time waiting on the index and unpacking, not on one core.
ensure_venv venv-mcp1 1.30.0 &
p1=$!
ensure_venv venv-mcp2 2.3.0 &
p2=$!
rc=0
wait "$p1" || rc=1
wait "$p2" || rc=1
[ "$rc" = 0 ] || fail "an install failed (see above)"

awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "install.sh: done in %.1f s\n", e - s }'
