#!/usr/bin/env node
// The whole client workflow with the official TypeScript client 2.x (`@modelcontextprotocol/client`, the split
// package of SDK v2), against `mcpfleet serve --fixtures conformance`, one replica or a fleet behind a round-robin
// proxy, in either protocol generation:
//   --generation 2025  the session generation (the client's default `versionNegotiation: 'legacy'`: initialize,
//                      Mcp-Session-Id, server→client requests on the call's SSE stream, resumption, DELETE)
//   --generation 2026  2026-07-28 (`versionNegotiation: { mode: 'auto' }`: server/discover, per-request _meta,
//                      sampling and elicitation as input_required results fulfilled by the same handlers)
// Without --generation it runs both, one after the other, and prints one JSON line for each (2025 first).
// Every step is asserted; the first failure prints what failed and exits 1.
//
//   .tools/node_modules/.bin/node tests/interop/node/workflow-client2.mjs --url http://127.0.0.1:PORT/mcp [--generation 2025|2026]
import { assert, assertEq, elicitationAnswer, firstText, generationArgs, importPkg, packageVersion, recordingFetch, samplingAnswer, Steps } from './lib.mjs';
import { basicSteps, interactiveSteps, loopStep, resumptionStep, terminateSessionStep } from './workflow-common.mjs';

const PKG = '@modelcontextprotocol/client';
const { url, generations } = generationArgs();
const sdk = await importPkg(PKG);
const { Client, StreamableHTTPClientTransport } = sdk;
const VERSION = packageVersion(PKG);
const MODERN = '2026-07-28';

async function run(gen) {
  const rec = recordingFetch();
  const S = new Steps({ client: 'ts-client', version: VERSION, generation: gen, recorder: rec });
  const handled = { sampling: 0, elicitation: 0 };
  const errors = [];
  const client = new Client(
    { name: 'mcpfleet-interop-client2', version: '1.0.0' },
    {
      capabilities: { sampling: {}, elicitation: { form: {} } },
      versionNegotiation: gen === '2026' ? { mode: 'auto' } : { mode: 'legacy' },
    },
  );
  client.setRequestHandler('sampling/createMessage', async (req) => {
    handled.sampling++;
    return samplingAnswer(req.params);
  });
  client.setRequestHandler('elicitation/create', async (req) => {
    handled.elicitation++;
    return elicitationAnswer(req.params);
  });
  client.onerror = (e) => errors.push(String(e?.message ?? e));
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: rec,
    reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
  });
  const callTool = (params, opts) => client.callTool(params, opts);

  await S.step('connect', async () => {
    await client.connect(transport);
    assertEq(client.getServerVersion()?.name, 'mcpfleet', 'serverInfo.name');
    const caps = client.getServerCapabilities();
    for (const c of ['tools', 'resources', 'prompts', 'completions']) assert(caps?.[c], `server capabilities lack ${c}`, caps);
    const era = client.getProtocolEra();
    const v = client.getNegotiatedProtocolVersion();
    if (gen === '2026') {
      assertEq(era, 'modern', 'protocol era');
      assertEq(v, MODERN, 'negotiated protocol version');
      assertEq(transport.sessionId, undefined, 'session id (2026-07-28 has none)');
      const probes = rec.log.filter((x) => x.rpc === 'server/discover');
      assert(probes.length >= 1 && probes.every((x) => x['mcp-protocol-version'] === MODERN), 'connect did not probe with server/discover', rec.log);
      assert(!rec.log.some((x) => x.rpc === 'initialize'), 'a 2026-07-28 connect sent initialize', rec.log);
    } else {
      assertEq(era, 'legacy', 'protocol era');
      assert(v && !v.startsWith('2026'), `negotiated protocol version ${v}`);
      assert(transport.sessionId, 'no Mcp-Session-Id after initialize');
      assert(!rec.log.some((x) => x.rpc === 'server/discover'), 'a legacy connect probed with server/discover', rec.log);
    }
    return `${era} ${v}`;
  });

  await basicSteps(S, client, callTool);

  if (gen === '2026') {
    await S.step('2026 request headers', async () => {
      // Every request of this generation names its method (and tool) in headers, and carries the version.
      const calls = rec.log.filter((x) => x.method === 'POST' && x.rpc === 'tools/call');
      assert(calls.length > 0, 'no tools/call recorded');
      for (const c of calls) {
        assertEq([c['mcp-protocol-version'], c['mcp-method'], c['mcp-name'], c['mcp-session-id']], [MODERN, 'tools/call', 'test_simple_text', undefined], 'tools/call headers');
      }
    });
  }

  await interactiveSteps(S, client, callTool, handled);

  if (gen === '2026') {
    await S.step('multi round-trip', async () => {
      // Sampling and elicitation above were input_required rounds (the server never sends a request in this
      // generation): each tools/call was sent twice, the retry with inputResponses + requestState.
      const calls = rec.log.filter((x) => x.rpc === 'tools/call' && (x['mcp-name'] === 'test_sampling' || x['mcp-name'] === 'test_elicitation'));
      assertEq(calls.map((c) => c['mcp-name']), ['test_sampling', 'test_sampling', 'test_elicitation', 'test_elicitation'], 'tools/call rounds');
      assert(!rec.log.some((x) => x.method === 'POST' && x.rpc === 'result'), 'the client POSTed a JSON-RPC response in 2026-07-28', rec.log);
      // Two asks in two rounds: the retry lands on whichever replica the proxy picks.
      const mark = rec.mark();
      const r = await callTool({ name: 'test_input_required_result_multi_round', arguments: {} });
      assertEq(firstText(r), 'interop-name likes interop-color.', 'test_input_required_result_multi_round text');
      const rounds = rec.since(mark).filter((x) => x.rpc === 'tools/call').length;
      assertEq(rounds, 3, 'tools/call rounds of test_input_required_result_multi_round (two asks, then the result)');
      return `sampling 2 rounds, elicitation 2 rounds, multi_round ${rounds} rounds`;
    });
    S.skip('resumption', '2026-07-28 streams are not resumable (no Last-Event-ID, no GET); the server refuses test_reconnection there (ClientUnsupported "stream resumption", crates/transport/src/stateless/call.rs)');
    await S.step('no session to terminate', async () => {
      const mark = rec.mark();
      await transport.terminateSession();
      assertEq(rec.since(mark).filter((x) => x.method === 'DELETE').length, 0, 'DELETE requests sent (2026-07-28 has no session)');
      assert(!rec.log.some((x) => x.method === 'GET' || x.method === 'DELETE'), 'a GET or DELETE was sent in 2026-07-28', rec.log.filter((x) => x.method !== 'POST'));
    });
    S.skip('terminate session (DELETE)', '2026-07-28 has no session: terminateSession() returns without a request when there is no session id');
  } else {
    await resumptionStep(S, rec, callTool);
  }

  await loopStep(S, callTool);

  if (gen === '2025') await terminateSessionStep(S, rec, transport, url);

  await client.close();
  return S.summary({ sdkErrors: errors.length });
}

for (const gen of generations) {
  console.log(JSON.stringify(await run(gen)));
}
process.exit(0);
