#!/usr/bin/env node
// The whole client workflow with the official TypeScript SDK 1.x (`@modelcontextprotocol/sdk`: `Client` +
// `StreamableHTTPClientTransport`), against `mcpfleet serve --fixtures conformance`, one replica or a fleet behind
// a round-robin proxy. Every step is asserted; the first failure prints what failed and exits 1; success prints
// one JSON line {"client":"ts-sdk","version":"1.32.2","generation":"2025",...}.
//
//   .tools/node_modules/.bin/node tests/interop/node/workflow-sdk1.mjs --url http://127.0.0.1:PORT/mcp
import { assert, assertEq, cliArgs, elicitationAnswer, importPkg, packageVersion, recordingFetch, samplingAnswer, Steps } from './lib.mjs';
import { basicSteps, interactiveSteps, loopStep, resumptionStep, terminateSessionStep } from './workflow-common.mjs';

const PKG = '@modelcontextprotocol/sdk';
const { url } = cliArgs();
const { Client } = await importPkg(PKG, './client/index.js');
const { StreamableHTTPClientTransport } = await importPkg(PKG, './client/streamableHttp.js');
const { CreateMessageRequestSchema, ElicitRequestSchema, CallToolResultSchema, LATEST_PROTOCOL_VERSION } = await importPkg(PKG, './types.js');

const rec = recordingFetch();
const S = new Steps({ client: 'ts-sdk', version: packageVersion(PKG), generation: '2025', recorder: rec });
const handled = { sampling: 0, elicitation: 0 };
const errors = [];

const client = new Client({ name: 'mcpfleet-interop-sdk1', version: '1.0.0' }, { capabilities: { sampling: {}, elicitation: {} } });
client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
  handled.sampling++;
  return samplingAnswer(req.params);
});
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  handled.elicitation++;
  return elicitationAnswer(req.params);
});
// The server's `retry:` hint (1 s by default) paces the reconnection; allow a few attempts.
const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: rec,
  reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
});
client.onerror = (e) => errors.push(String(e?.message ?? e));
const callTool = (params, opts) => client.callTool(params, CallToolResultSchema, opts);

await S.step('connect', async () => {
  await client.connect(transport);
  const info = client.getServerVersion();
  assertEq(info?.name, 'mcpfleet', 'serverInfo.name');
  assert(transport.sessionId, 'no Mcp-Session-Id after initialize');
  assertEq(transport.protocolVersion, LATEST_PROTOCOL_VERSION, 'negotiated protocol version');
  const caps = client.getServerCapabilities();
  for (const c of ['tools', 'resources', 'prompts', 'completions']) assert(caps?.[c], `server capabilities lack ${c}`, caps);
  return `protocol ${transport.protocolVersion}`;
});

await basicSteps(S, client, callTool);
await interactiveSteps(S, client, callTool, handled);

await resumptionStep(S, rec, callTool);

await loopStep(S, callTool);

await terminateSessionStep(S, rec, transport, url, LATEST_PROTOCOL_VERSION);

await client.close();
S.done({ sdkErrors: errors.length });
process.exit(0);
