// The steps that the SDK 1.x and client 2.x workflows share: everything that goes through `Client` methods whose
// shape is the same in both lines. The `api` argument adapts the few calls that differ (callTool's signature).
import { assert, assertEq, firstText } from './lib.mjs';

export const SIMPLE_TEXT = 'This is a simple text response for testing.';
export const STATIC_TEXT = 'This is the content of the static text resource.';

/**
 * connect → lists → tool → resource → template resource → prompts → completion. `callTool(params, opts)` is the
 * adapter (1.x takes a result schema as its second argument, 2.x does not).
 */
export async function basicSteps(S, client, callTool) {
  await S.step('list tools', async () => {
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name);
    for (const n of ['test_simple_text', 'test_tool_with_progress', 'test_sampling', 'test_elicitation', 'test_reconnection', 'test_countdown']) {
      assert(names.includes(n), `tools/list lacks ${n}`, names);
    }
    return `${tools.length} tools`;
  });
  await S.step('list resources', async () => {
    const { resources } = await client.listResources();
    const uris = resources.map((r) => r.uri);
    assert(uris.includes('test://static-text'), 'resources/list lacks test://static-text', uris);
    return `${resources.length} resources`;
  });
  await S.step('list resource templates', async () => {
    const { resourceTemplates } = await client.listResourceTemplates();
    const t = resourceTemplates.map((r) => r.uriTemplate);
    assert(t.includes('test://template/{id}/data'), 'resources/templates/list lacks test://template/{id}/data', t);
    return `${resourceTemplates.length} templates`;
  });
  await S.step('list prompts', async () => {
    const { prompts } = await client.listPrompts();
    const names = prompts.map((p) => p.name);
    for (const n of ['test_simple_prompt', 'test_prompt_with_arguments']) assert(names.includes(n), `prompts/list lacks ${n}`, names);
    const withArgs = prompts.find((p) => p.name === 'test_prompt_with_arguments');
    assertEq(withArgs.arguments?.map((a) => a.name), ['arg1', 'arg2'], 'test_prompt_with_arguments arguments');
    return `${prompts.length} prompts`;
  });
  await S.step('call tool', async () => {
    const r = await callTool({ name: 'test_simple_text', arguments: {} });
    assert(!r.isError, 'test_simple_text returned isError', r);
    assertEq(firstText(r), SIMPLE_TEXT, 'test_simple_text text');
  });
  await S.step('read resource', async () => {
    const r = await client.readResource({ uri: 'test://static-text' });
    assertEq(r.contents?.length, 1, 'contents length');
    assertEq(r.contents[0].uri, 'test://static-text', 'contents[0].uri');
    assertEq(r.contents[0].text, STATIC_TEXT, 'contents[0].text');
  });
  await S.step('read template resource', async () => {
    const r = await client.readResource({ uri: 'test://template/42/data' });
    const body = JSON.parse(r.contents?.[0]?.text ?? 'null');
    assertEq(body, { data: 'Data for ID: 42', id: '42', templateTest: true }, 'test://template/42/data');
  });
  await S.step('get prompt', async () => {
    const r = await client.getPrompt({ name: 'test_simple_prompt' });
    assertEq(r.messages?.map((m) => [m.role, m.content?.text]), [['user', 'This is a simple prompt for testing.']], 'test_simple_prompt messages');
  });
  await S.step('get prompt with arguments', async () => {
    const r = await client.getPrompt({ name: 'test_prompt_with_arguments', arguments: { arg1: 'alpha', arg2: 'beta' } });
    assertEq(r.messages?.[0]?.content?.text, "Prompt with arguments: arg1='alpha', arg2='beta'", 'test_prompt_with_arguments text');
  });
  await S.step('completion', async () => {
    const r = await client.complete({ ref: { type: 'ref/prompt', name: 'test_prompt_with_arguments' }, argument: { name: 'arg1', value: 'pa' } });
    assertEq(r.completion?.values, ['paris', 'park', 'party'], 'completion values for arg1="pa"');
    assertEq(r.completion?.hasMore, false, 'completion hasMore');
  });
}

/** Sampling, elicitation and progress; `handled` counts what the client's request handlers answered. */
export async function interactiveSteps(S, client, callTool, handled) {
  await S.step('sampling', async () => {
    const before = handled.sampling;
    const r = await callTool({ name: 'test_sampling', arguments: { prompt: 'Say hello to the fleet' } });
    assert(!r.isError, 'test_sampling returned isError', r);
    assertEq(handled.sampling - before, 1, 'sampling/createMessage requests answered by the client');
    assertEq(firstText(r), 'LLM response: echo: Say hello to the fleet', 'test_sampling text');
  });
  await S.step('elicitation', async () => {
    const before = handled.elicitation;
    const r = await callTool({ name: 'test_elicitation', arguments: { message: 'Who are you?' } });
    assert(!r.isError, 'test_elicitation returned isError', r);
    assertEq(handled.elicitation - before, 1, 'elicitation/create requests answered by the client');
    const text = firstText(r) ?? '';
    assert(text.startsWith('User response: action="accept"'), `test_elicitation text: ${text}`);
    assert(text.includes('"username":"interop-username"') && text.includes('"email":"interop@example.com"'), `test_elicitation content: ${text}`);
  });
  await S.step('progress', async () => {
    const seen = [];
    const r = await callTool({ name: 'test_tool_with_progress', arguments: {} }, { onprogress: (p) => seen.push(p) });
    assertEq(firstText(r), 'Progress test completed', 'test_tool_with_progress text');
    assertEq(seen.map((p) => [p.progress, p.total]), [[0, 100], [50, 100], [100, 100]], 'progress notifications');
    assertEq(seen.map((p) => p.message), ['Completed step 1', 'Completed step 2', 'Completed step 3'], 'progress messages');
    return `${seen.length} notifications`;
  });
  await S.step('progress (countdown)', async () => {
    const seen = [];
    const r = await callTool(
      { name: 'test_countdown', arguments: { count: 5, interval_ms: 50 } },
      { onprogress: (p) => seen.push(p.progress), resetTimeoutOnProgress: true },
    );
    assertEq(firstText(r), 'counted to 5', 'test_countdown text');
    assertEq(seen, [1, 2, 3, 4, 5], 'countdown progress');
  });
}

/** 100 sequential tools/call, every one asserted. */
export async function loopStep(S, callTool, n = 100) {
  await S.step(`${n} tools/call`, async () => {
    for (let i = 0; i < n; i++) {
      let r;
      try {
        r = await callTool({ name: 'test_simple_text', arguments: {} });
      } catch (e) {
        e.message = `call ${i + 1} of ${n} failed: ${e.message}`;
        throw e;
      }
      if (r.isError || firstText(r) !== SIMPLE_TEXT) throw new Error(`call ${i + 1} of ${n} answered ${JSON.stringify(r)}`);
    }
    return `${n} ok`;
  });
}

/**
 * Resumption (session generation): test_reconnection closes its SSE response stream on purpose after a priming
 * event; the SDK must reconnect with GET + Last-Event-ID (on whichever replica the proxy picks) and get the result
 * from there. `rec` is the run's recordingFetch.
 */
export async function resumptionStep(S, rec, callTool) {
  await S.step('resumption', async () => {
    const mark = rec.mark();
    const r = await callTool({ name: 'test_reconnection', arguments: {} });
    assert(!r.isError, 'test_reconnection returned isError', r);
    assert((firstText(r) ?? '').includes('the client properly reconnected'), `test_reconnection text: ${firstText(r)}`);
    const resumes = rec.since(mark).filter((x) => x.method === 'GET' && x['last-event-id']);
    assert(resumes.length >= 1, 'the result arrived without a GET carrying Last-Event-ID', rec.since(mark));
    assert(resumes.some((x) => x.status === 200 && x.type === 'text/event-stream'), 'no resuming GET was answered 200 text/event-stream', resumes);
    return `resumed with Last-Event-ID ${resumes[0]['last-event-id']}`;
  });
}

/**
 * `transport.terminateSession()` (session generation): one DELETE, answered 2xx, and no session id left; then the
 * session is gone on every replica: a request naming it gets 404. That request carries `protocolVersion` as its
 * MCP-Protocol-Version (without it, the transport's own, read before the DELETE).
 */
export async function terminateSessionStep(S, rec, transport, url, protocolVersion) {
  await S.step('terminate session', async () => {
    const sid = transport.sessionId;
    const pv = protocolVersion ?? transport.protocolVersion;
    const mark = rec.mark();
    await transport.terminateSession();
    const del = rec.since(mark).filter((x) => x.method === 'DELETE');
    assertEq(del.length, 1, 'DELETE requests sent');
    assert(del[0].status >= 200 && del[0].status < 300, `DELETE answered ${del[0].status} (the SDK also accepts 405; we do not)`);
    assertEq(transport.sessionId, undefined, 'session id after terminateSession');
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': pv },
      body: JSON.stringify({ jsonrpc: '2.0', id: 999, method: 'tools/list', params: {} }),
    });
    await res.body?.cancel();
    assertEq(res.status, 404, 'status of a request on the terminated session');
    return `DELETE ${del[0].status}, then 404`;
  });
}
