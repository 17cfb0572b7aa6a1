#!/usr/bin/env node
// OAuth with the official TypeScript SDK 1.x against `mcpfleet serve --fixtures conformance --auth dev` and no
// token: discovery from the 401 (RFC 9728 → RFC 8414), dynamic registration, authorization code + PKCE (the dev
// consent auto-approves; our provider "opens the browser" with a fetch that does not follow the redirect),
// `transport.finishAuth(code)` and reconnect, tools/list, then test_whoami, which needs fixtures:whoami: the
// server answers 403 insufficient_scope and the SDK must step up. Prints whoami's sub and scopes in the final line.
// SDK 1.x asks for the challenge's scope as is (never offline_access), so the server issues it no refresh token,
// and that is what lets it step up by itself: holding a refresh token, it would refresh instead (typescript-sdk#2255).
//
//   .tools/node_modules/.bin/node tests/interop/node/oauth-sdk1.mjs --url http://127.0.0.1:PORT/mcp
import { cliArgs, importPkg, packageVersion, Steps } from './lib.mjs';
import { oauthWorkflow } from './oauth-common.mjs';

const PKG = '@modelcontextprotocol/sdk';
const { url } = cliArgs();
const { Client } = await importPkg(PKG, './client/index.js');
const { StreamableHTTPClientTransport } = await importPkg(PKG, './client/streamableHttp.js');
const { UnauthorizedError } = await importPkg(PKG, './client/auth.js');
const { CallToolResultSchema } = await importPkg(PKG, './types.js');

const S = new Steps({ client: 'ts-sdk', version: packageVersion(PKG), generation: '2025' });
const result = await oauthWorkflow(S, url, {
  newClient: () => new Client({ name: 'mcpfleet-interop-oauth-sdk1', version: '1.0.0' }, { capabilities: {} }),
  newTransport: (provider, fetch) => new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch }),
  finishAuth: (transport, provider) => transport.finishAuth(provider.callback.get('code')),
  callTool: (client, params) => client.callTool(params, CallToolResultSchema),
  isUnauthorized: (e) => e instanceof UnauthorizedError,
  asksOfflineAccess: false,
  refreshesInsteadOfStepUp: true,
});
S.done({ auth: 'oauth', whoami: result.whoami, notes: result.notes });
process.exit(0);
