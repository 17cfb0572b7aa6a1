#!/usr/bin/env node
// OAuth with the official TypeScript client 2.x against `mcpfleet serve --fixtures conformance --auth dev` and no
// token: discovery from the 401 (RFC 9728 → RFC 8414, with the issuer echo check), dynamic registration,
// authorization code + PKCE (the dev consent auto-approves; our provider "opens the browser" with a fetch that does
// not follow the redirect), `transport.finishAuth(callbackParams)` (code + iss, RFC 9207) and reconnect,
// tools/list, then test_whoami, which needs fixtures:whoami: the server answers 403 insufficient_scope and the
// client steps up (SEP-2350). Prints whoami's sub and scopes in the final line.
//   --generation 2025 | 2026   the session generation, or 2026-07-28 (versionNegotiation auto); default: both,
//                              one JSON line each (2025 first)
//
//   .tools/node_modules/.bin/node tests/interop/node/oauth-client2.mjs --url http://127.0.0.1:PORT/mcp [--generation 2025|2026]
import { generationArgs, importPkg, packageVersion, Steps } from './lib.mjs';
import { oauthWorkflow } from './oauth-common.mjs';

const PKG = '@modelcontextprotocol/client';
const { url, generations } = generationArgs();
const { Client, StreamableHTTPClientTransport, UnauthorizedError } = await importPkg(PKG);

for (const gen of generations) {
  const S = new Steps({ client: 'ts-client', version: packageVersion(PKG), generation: gen });
  const result = await oauthWorkflow(
    S,
    url,
    {
      newClient: () =>
        new Client(
          { name: 'mcpfleet-interop-oauth-client2', version: '1.0.0' },
          { capabilities: {}, versionNegotiation: gen === '2026' ? { mode: 'auto' } : { mode: 'legacy' } },
        ),
      newTransport: (provider, fetch) => new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch }),
      finishAuth: (transport, provider) => transport.finishAuth(provider.callback),
      callTool: (client, params) => client.callTool(params),
      isUnauthorized: (e) => e instanceof UnauthorizedError,
      asksOfflineAccess: true,
    },
    { generation: gen },
  );
  console.log(JSON.stringify(S.summary({ auth: 'oauth', whoami: result.whoami, notes: result.notes })));
}
process.exit(0);
