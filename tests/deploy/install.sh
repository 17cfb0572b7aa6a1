#!/usr/bin/env bash
# Installs what the offline checks of the deployment files need, under .tools/ at the repository root:
#   .tools/venv-deploy   helm-python-sdk (the Helm v4 SDK: render, lint, values schema) and kubernetes-validate
#                        (Kubernetes' schemas, strict), pinned below
#   .tools/prometheus    promtool, from Debian's prometheus package, unpacked with apt-get download + dpkg-deb -x
#                        (no service is installed or started)
# Idempotent: what is there at the right version is left alone. Quiet; fails loudly.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
HELM_SDK=0.2.2
KUBE_VALIDATE=1.37.0

fail() { echo "install.sh: error: $*" >&2; exit 1; }

venv="$ROOT/.tools/venv-deploy"
have="$("$venv/bin/python" -c 'from importlib.metadata import version as v; print(v("helm-python-sdk"), v("kubernetes-validate"))' 2>/dev/null || true)"
if [ "$have" != "$HELM_SDK $KUBE_VALIDATE" ]; then
  rm -rf "$venv"
  mkdir -p "$ROOT/.tools"
  "$PYTHON" -m venv "$venv" || fail "$PYTHON -m venv $venv failed (on Debian: apt-get install python3-venv)"
  echo '*' >"$venv/.gitignore"
  log="$(mktemp)"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
      "helm-python-sdk==$HELM_SDK" "kubernetes-validate==$KUBE_VALIDATE" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    fail "pip install into $venv failed"
  fi
  rm -f "$log"
  echo "venv-deploy: installed helm-python-sdk $HELM_SDK, kubernetes-validate $KUBE_VALIDATE"
fi

prom="$ROOT/.tools/prometheus"
if ! "$prom/usr/bin/promtool" --version >/dev/null 2>&1; then
  command -v apt-get >/dev/null || fail "apt-get not found: promtool comes from Debian's prometheus package"
  tmp="$(mktemp -d)"
  # apt-get download writes as the _apt user when it can: give it a directory it may write.
  chmod 0777 "$tmp"
  (cd "$tmp" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus; }; }) \
    || fail "apt-get download prometheus failed"
  rm -rf "$prom"
  mkdir -p "$prom"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$prom" || fail "dpkg-deb -x failed"
  rm -rf "$tmp"
  echo '*' >"$prom/.gitignore"
  "$prom/usr/bin/promtool" --version 2>&1 | head -1
fi
