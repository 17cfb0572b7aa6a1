#!/usr/bin/env bash
# Runs the whole test suite, as a new user or CI would: installs what is missing (redis-server and Chromium from
# Debian, Node 22, the MCP conformance suites, the official TypeScript clients, puppeteer-core, esbuild, and
# oidc-provider and jose (the downstream tests' authorization servers) into .tools/ from npm, the official Python SDK 1.x and 2.x into two venvs under .tools/ from PyPI, the Helm SDK,
# kubernetes-validate and promtool for the deployment checks), runs the offline checks of helm/ and deploy/, then
# runs every Rust test, which includes the conformance suites, the official clients' interop workflows and the SDK
# in a browser against three Redis-backed replicas behind a round-robin proxy, and the rendered chart's Deployment
# booted against real Redis and PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  echo "installing $*"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "$@"; else sudo apt-get update -qq && sudo apt-get install -y -qq "$@"; fi
}
# The suites start their own redis-server and talk to it with redis-cli; the testkit signals processes with
# /bin/kill (procps), not the shell builtin; npm fetches Node 22 and the conformance suite.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then apt_install redis-server; fi
if ! type -P kill >/dev/null 2>&1; then apt_install procps; fi
# The partition tests cut links between network namespaces of their own (ip netns, veth).
if ! type -P ip >/dev/null 2>&1; then apt_install iproute2; fi
if [ ! -x /usr/lib/postgresql/15/bin/initdb ] || ! type -P openssl >/dev/null; then apt_install postgresql-15 openssl; fi
if ! command -v npm >/dev/null 2>&1; then apt_install nodejs npm; fi
# The browser test (tests/browser.rs) drives Debian's Chromium with puppeteer-core (which downloads no browser).
if [ ! -x /usr/bin/chromium ]; then apt_install chromium; fi

tools=.tools
# Node 22, the conformance suites, the official TypeScript clients (interop tests), puppeteer-core and esbuild
# (the browser tests), and oidc-provider and jose (tests/downstream/servers.mjs) are pinned in .tools/package.json; any of them missing reinstalls from the lockfile.
node_missing=0
for f in .bin/node @modelcontextprotocol/conformance/dist/index.js conformance-2026/dist/index.js \
         @modelcontextprotocol/sdk/package.json @modelcontextprotocol/client/package.json \
         @modelcontextprotocol/inspector/package.json puppeteer-core/package.json esbuild/package.json \
         oidc-provider/package.json jose/package.json; do
  [ -e "$tools/node_modules/$f" ] || node_missing=1
done
if [ "$node_missing" = 1 ] || ! "$tools/node_modules/.bin/node" --version 2>/dev/null | grep -q '^v22\.'; then
  echo "installing Node 22, the conformance suites, the MCP TypeScript clients, puppeteer-core and esbuild into $tools"
  (cd "$tools" && npm install --no-audit --no-fund --loglevel=error && npm rebuild node --loglevel=error)
fi
# The official Python SDK, mcp 1.x and 2.x, in two venvs under .tools (interop tests).
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then apt_install python3-venv; fi
tests/interop/python/install.sh

# The deployment files, offline (docs/TESTING.md, "Deployment"): the Helm SDK and Kubernetes' schemas into
# .tools/venv-deploy from PyPI, promtool from Debian's prometheus package into .tools/prometheus; then the chart
# renders, lints and validates strictly, bad values files are refused, the alert rules pass promtool's unit tests.
# The end-to-end suite (tests/deploy.rs) then boots the rendered Deployment against real Redis and PostgreSQL.
if ! type -P dpkg-deb >/dev/null 2>&1; then apt_install dpkg; fi
tests/deploy/install.sh
.tools/venv-deploy/bin/python tests/deploy/check.py offline

# The tree's shape: no import circle among a crate's files, no source file over 800 lines outside tests.
python3 tests/tree-check.py
# The release records agree: releases.toml, CHANGELOG.md, docs/UPGRADING.md, the workspace and chart versions.
python3 tests/release-check.py

# The mixed-version suite (e2e upgrade::) runs the newest release's binary beside this tree's: built from its commit
# once per machine, into a cache outside the checkout (docs/TESTING.md, "Mixed versions"). Built here, before the
# tests, so that its cost shows as its own step.
tests/release-bin.sh >/dev/null

# tests/deploy.rs drives load with the load generator's binary, which `cargo test` builds only as a test target.
cargo build -p mcpfleet-loadgen
cargo test --workspace --all-targets -- --nocapture
