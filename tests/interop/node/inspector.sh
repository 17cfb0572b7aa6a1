#!/usr/bin/env bash
# The MCP Inspector CLI workflow: inspector.sh URL [--generation 2025|2026]. See inspector.mjs.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
url="${1:?usage: inspector.sh URL [--generation 2025|2026]}"
shift
exec "$root/.tools/node_modules/.bin/node" "$root/tests/interop/node/inspector.mjs" --url "$url" "$@"
