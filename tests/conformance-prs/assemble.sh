#!/usr/bin/env bash
# Assembles the conformance repository's pull-request scenarios that mcpfleet is witnessed against (docs/TESTING.md,
# "Scenarios from the conformance repository's pull requests") into one runnable bundle, offline:
#   tests/conformance-prs/assemble.sh GIT_DIR
# GIT_DIR is a clone or bare mirror of modelcontextprotocol/conformance that holds refs/pull/*/head (the `fetch`
# tool's mirror has them). The tree is #436's (cancellation) with the scenario files of #438
# (http-stream-cancellation), #395 (auth/dpop-server-validation) and #308 (sep-2106-structured-content) added and
# registered; it is bundled with the esbuild of .tools against .tools/node_modules (no npm install) into
# .tools/conformance-prs/conformance.mjs. Run it with Node 22: node .tools/conformance-prs/conformance.mjs server ...
set -euo pipefail
git_dir=${1:?usage: assemble.sh GIT_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/.tools/conformance-prs"
declare -A heads=(
  [436]=35452176e5b144a93c2f57a2f637fa0eb6c3e6b2
  [438]=4d824f7ce2d5e1f87c9e342380a7c551a3d68afa
  [395]=c51d0606d3da3d6a85b48aae1a26e9509204e6e9
  [308]=7d4b97d25ba75cccbf4c55d97696fb031173d6fc
)
rm -rf "$out" && mkdir -p "$out"
git -C "$git_dir" archive "${heads[436]}" | tar -x -C "$out"
take() { git -C "$git_dir" show "$1:$2" > "$out/$2"; }
take "${heads[438]}" src/scenarios/server/http-stream-cancellation.ts
take "${heads[438]}" src/scenarios/server/per-request-loglevel.ts
mkdir -p "$out/src/scenarios/server/auth"
take "${heads[395]}" src/scenarios/server/auth/dpop.ts
take "${heads[395]}" src/scenarios/server/auth/spec-references.ts
take "${heads[308]}" src/scenarios/server/sep-2106-structured-content.ts
python3 - "$out/src/scenarios/index.ts" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
imports = """import { HttpStreamCancellationScenario } from './server/http-stream-cancellation';
import { DPoPServerValidationScenario } from './server/auth/dpop';
import { Sep2106StructuredContentScenario } from './server/sep-2106-structured-content';
import type { RunContext } from '../connection';
// PR #308 predates RunContext: its scenario takes the server URL.
class Sep2106StructuredContentCtx extends Sep2106StructuredContentScenario {
  async run(ctx: RunContext | string) { return super.run(typeof ctx === 'string' ? ctx : ctx.serverUrl); }
}
"""
anchor = "// Pending client scenarios"
i = s.index(anchor)
s = s[:i] + imports + "\n" + s[i:]
# Registered first in the list of every scenario the CLI's `server` command runs.
marker = "const allClientScenariosList: ClientScenario[] = [\n"
assert marker in s, "the scenario list is not where expected"
s = s.replace(marker, marker + """  new HttpStreamCancellationScenario(),
  new DPoPServerValidationScenario(),
  new Sep2106StructuredContentCtx() as unknown as ClientScenario,
""", 1)
open(p, "w").write(s)
PY
ln -sfn "$root/.tools/node_modules" "$out/node_modules"
(cd "$out" && "$root/.tools/node_modules/.bin/esbuild" src/index.ts --bundle --platform=node --format=esm \
  --target=node22 --packages=external --log-level=warning --outfile=conformance.mjs)
echo "$out/conformance.mjs"
