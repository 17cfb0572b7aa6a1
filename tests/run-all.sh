#!/usr/bin/env bash
# Runs the whole test suite, as a new user or CI would: installs what is missing (redis-server from Debian,
# Node 22 and the MCP conformance suite into .tools/ from npm), then runs every Rust test, which includes the
# conformance suite against one in-memory replica and against three Redis-backed replicas behind a round-robin
# proxy.
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
if ! command -v npm >/dev/null 2>&1; then apt_install nodejs npm; fi

tools=.tools
if [ ! -x "$tools/node_modules/.bin/node" ] || [ ! -f "$tools/node_modules/@modelcontextprotocol/conformance/dist/index.js" ] \
   || [ ! -f "$tools/node_modules/conformance-2026/dist/index.js" ] \
   || ! "$tools/node_modules/.bin/node" --version 2>/dev/null | grep -q '^v22\.'; then
  echo "installing Node 22 and @modelcontextprotocol/conformance into $tools"
  (cd "$tools" && npm install --no-audit --no-fund --loglevel=error && npm rebuild node --loglevel=error)
fi

cargo test --workspace --all-targets -- --nocapture
