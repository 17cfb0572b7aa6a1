// The page of the browser test (tests/browser.rs): the official TypeScript SDK 1.x (`Client` +
// `StreamableHTTPClientTransport`), bundled for the browser by driver.mjs with esbuild, running in Chromium on an
// origin other than the server's. It takes its orders from its query string (`scenario`, `server`), runs its steps,
// and leaves its report in `window.__mcpResult` for the driver: {scenario, origin, ok, steps, requests}, each step
// {name, ok, ms, detail | error}. The scenarios:
//
//   session   initialize, tools/list, tools/call, progress over SSE, a stream resumed with Last-Event-ID, DELETE
//   oauth     against `--auth dev` with no token: the SDK's 401 → discovery → registration, then a real
//             navigation to the authorization endpoint and back to /callback, the token, the MCP calls, the 403
//             insufficient_scope step-up (a second round trip through the authorization endpoint), the same
//             session resumed, test_whoami, DELETE. The run's state crosses the navigations in sessionStorage, as a
//             browser app's would.
//   refused   initialize from an origin the server does not allow: must fail
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { withDeadline } from '../interop/node/deadline.mjs';

const STORE = 'mcpfleet-browser-test';
const SIMPLE_TEXT = 'This is a simple text response for testing.';

class StepFailed extends Error {}

function describe(err) {
  if (!err || typeof err !== 'object') return { message: String(err) };
  const out = { name: err.name, message: err.message };
  if (err.code !== undefined) out.code = err.code;
  if (err.cause) out.cause = String(err.cause?.message ?? err.cause);
  if (err.stack) out.stack = String(err.stack).split('\n').slice(0, 6).join('\n');
  return out;
}

function assert(cond, message, detail) {
  if (!cond) throw new Error(detail === undefined ? message : `${message}: ${JSON.stringify(detail)}`);
}

function firstText(result) {
  return (result?.content ?? []).find((c) => c.type === 'text')?.text;
}

function randomToken() {
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return btoa(String.fromCharCode(...bytes)).replace(/[+/=]/g, (c) => ({ '+': '-', '/': '_', '=': '' })[c]);
}

/** The run: its steps and the fetches the SDK made, kept in sessionStorage across navigations. */
class Run {
  constructor(state) {
    this.state = state;
  }

  static load() {
    const raw = sessionStorage.getItem(STORE);
    return raw ? new Run(JSON.parse(raw)) : undefined;
  }

  static start(scenario, server) {
    return new Run({ scenario, server, origin: location.origin, steps: [], requests: [], provider: { authorizations: [] } });
  }

  save() {
    sessionStorage.setItem(STORE, JSON.stringify(this.state));
  }

  async step(name, fn, { timeoutMs = 20_000 } = {}) {
    const t0 = performance.now();
    try {
      const detail = await withDeadline(fn, timeoutMs);
      const s = { name, ok: true, ms: Math.round(performance.now() - t0) };
      if (detail !== undefined) s.detail = detail;
      this.state.steps.push(s);
      console.log(`[page] ok ${name}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
      this.save();
      return detail;
    } catch (err) {
      this.state.steps.push({ name, ok: false, ms: Math.round(performance.now() - t0), error: describe(err) });
      console.error(`[page] FAIL ${name}: ${err?.stack ?? err}`);
      this.save();
      throw new StepFailed(name);
    }
  }

  /** Publishes the report and forgets the run. */
  finish(extra = {}) {
    const s = this.state;
    const ok = s.steps.length > 0 && s.steps.every((x) => x.ok);
    window.__mcpResult = { scenario: s.scenario, origin: s.origin, ok, steps: s.steps, requests: s.requests, ...extra };
    sessionStorage.removeItem(STORE);
    console.log(`[page] done ${s.scenario}: ${ok ? 'ok' : 'failed'}`);
  }

  /**
   * A fetch that records what the SDK asked the browser for (the method, the URL without its query, the names of
   * the request headers it set, its Content-Type and its Last-Event-ID) and what the page could read of the answer (the status,
   * the content type, the response headers CORS exposed to it, a challenge), or the error the fetch failed with.
   */
  fetch() {
    return async (input, init = {}) => {
      const url = new URL(input instanceof Request ? input.url : String(input));
      const headers = new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined));
      const rec = { method: (init.method ?? 'GET').toUpperCase(), url: url.origin + url.pathname, headers: [...headers.keys()].sort() };
      if (headers.get('content-type')) rec.sentType = headers.get('content-type');
      if (headers.get('last-event-id')) rec.lastEventId = headers.get('last-event-id');
      this.state.requests.push(rec);
      try {
        const res = await fetch(input, init);
        rec.status = res.status;
        rec.responseType = res.type;
        const ct = res.headers.get('content-type');
        if (ct) rec.contentType = ct.split(';')[0].trim();
        rec.exposed = [...res.headers.keys()].sort();
        const challenge = res.headers.get('www-authenticate');
        if (challenge) rec.challenge = challenge;
        return res;
      } catch (e) {
        rec.error = `${e?.name}: ${e?.message}`;
        throw e;
      } finally {
        this.save();
      }
    };
  }

  requestsSince(mark) {
    return this.state.requests.slice(mark);
  }
}

/**
 * The OAuthClientProvider of a browser app: a public client whose redirect URI is this page's `/callback`, its
 * state in sessionStorage (the run's), and `redirectToAuthorization` that remembers where to send the user; the
 * app navigates there once the SDK has given up the request (as soon as the run's state is saved).
 */
class BrowserOAuthProvider {
  constructor(run) {
    this.run = run;
    this.s = run.state.provider;
    this.pendingRedirect = undefined;
  }

  get redirectUrl() {
    return `${location.origin}/callback`;
  }

  get clientMetadata() {
    return {
      client_name: 'mcpfleet-browser-test',
      redirect_uris: [this.redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }

  state() {
    this.s.state = randomToken();
    this.run.save();
    return this.s.state;
  }

  clientInformation() {
    return this.s.clientInformation;
  }

  saveClientInformation(info) {
    this.s.clientInformation = info;
    this.run.save();
  }

  tokens() {
    return this.s.tokens;
  }

  saveTokens(tokens) {
    this.s.tokens = tokens;
    this.run.save();
  }

  saveCodeVerifier(v) {
    this.s.codeVerifier = v;
    this.run.save();
  }

  codeVerifier() {
    if (!this.s.codeVerifier) throw new Error('no code verifier saved');
    return this.s.codeVerifier;
  }

  saveDiscoveryState(d) {
    this.s.discoveryState = d;
    this.run.save();
  }

  discoveryState() {
    return this.s.discoveryState;
  }

  invalidateCredentials(scope) {
    if (scope === 'all' || scope === 'client') delete this.s.clientInformation;
    if (scope === 'all' || scope === 'tokens') delete this.s.tokens;
    if (scope === 'all' || scope === 'verifier') delete this.s.codeVerifier;
    if (scope === 'all' || scope === 'discovery') delete this.s.discoveryState;
    this.run.save();
  }

  redirectToAuthorization(url) {
    this.s.authorizations.push(url.href);
    this.run.save();
    this.pendingRedirect = url;
  }
}

function newClient() {
  return new Client({ name: 'mcpfleet-browser-test', version: '1.0.0' }, { capabilities: {} });
}

function newTransport(run, extra = {}) {
  return new StreamableHTTPClientTransport(new URL(run.state.server), {
    fetch: run.fetch(),
    // test_reconnection closes its stream on purpose; the server's `retry:` hint paces the reconnection.
    reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
    ...extra,
  });
}

const callTool = (client, params, opts) => client.callTool(params, CallToolResultSchema, opts);

async function initializeStep(run, client, transport) {
  await run.step('initialize', async () => {
    const mark = run.state.requests.length;
    await client.connect(transport);
    const init = run.requestsSince(mark).find((r) => r.method === 'POST');
    assert(client.getServerVersion()?.name === 'mcpfleet', 'serverInfo.name', client.getServerVersion());
    assert(transport.sessionId, 'no Mcp-Session-Id could be read from the initialize response', init);
    return { protocolVersion: transport.protocolVersion, status: init?.status, exposed: init?.exposed };
  });
}

async function listAndCallSteps(run, client) {
  await run.step('tools/list', async () => {
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name);
    for (const n of ['test_simple_text', 'test_tool_with_progress', 'test_reconnection']) assert(names.includes(n), `tools/list lacks ${n}`, names);
    return { tools: names.length };
  });
  await run.step('tools/call', async () => {
    const r = await callTool(client, { name: 'test_simple_text', arguments: {} });
    assert(!r.isError && firstText(r) === SIMPLE_TEXT, 'test_simple_text answered', r);
    return { text: firstText(r) };
  });
}

async function terminateStep(run, transport) {
  await run.step('DELETE the session', async () => {
    const sid = transport.sessionId;
    const pv = transport.protocolVersion;
    const mark = run.state.requests.length;
    await transport.terminateSession();
    const del = run.requestsSince(mark).filter((r) => r.method === 'DELETE');
    assert(del.length === 1 && del[0].status >= 200 && del[0].status < 300, 'one DELETE answered 2xx', del);
    assert(transport.sessionId === undefined, 'the transport kept its session id');
    // The session is gone on every replica; the page can read the 404 (CORS on an error answer too).
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': pv };
    const token = run.state.provider.tokens?.access_token;
    if (token) headers.authorization = `Bearer ${token}`;
    const res = await run.fetch()(run.state.server, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 99, method: 'tools/list', params: {} }) });
    await res.body?.cancel();
    assert(res.status === 404, `a request on the deleted session answered ${res.status}, not 404`);
    return { deleteStatus: del[0].status, afterwards: res.status };
  });
}

async function sessionScenario(run) {
  const client = newClient();
  const transport = newTransport(run);
  await initializeStep(run, client, transport);
  await listAndCallSteps(run, client);
  await run.step('progress over SSE', async () => {
    const mark = run.state.requests.length;
    const seen = [];
    const r = await callTool(client, { name: 'test_tool_with_progress', arguments: {} }, { onprogress: (p) => seen.push(p) });
    assert(firstText(r) === 'Progress test completed', 'test_tool_with_progress text', r);
    const post = run.requestsSince(mark).find((x) => x.method === 'POST');
    assert(post?.contentType === 'text/event-stream', 'the call was not answered with an SSE stream', post);
    return { progress: seen.map((p) => [p.progress, p.total, p.message]), contentType: post.contentType };
  });
  await run.step('resume with Last-Event-ID', async () => {
    const mark = run.state.requests.length;
    const r = await callTool(client, { name: 'test_reconnection', arguments: {} });
    assert(!r.isError && (firstText(r) ?? '').includes('the client properly reconnected'), 'test_reconnection text', r);
    const resumes = run.requestsSince(mark).filter((x) => x.method === 'GET' && x.lastEventId);
    assert(resumes.some((x) => x.status === 200 && x.contentType === 'text/event-stream'), 'no GET with Last-Event-ID answered 200 text/event-stream', run.requestsSince(mark));
    return { lastEventId: resumes[0].lastEventId, resumes: resumes.map((x) => x.status), text: firstText(r) };
  });
  await terminateStep(run, transport);
  await client.close();
}

async function refusedScenario(run) {
  const client = newClient();
  const transport = newTransport(run);
  await run.step('initialize is refused', async () => {
    let err;
    try {
      await client.connect(transport);
    } catch (e) {
      err = e;
    }
    assert(err, 'initialize succeeded from an origin the server does not allow');
    const post = run.state.requests.find((r) => r.method === 'POST');
    return { error: describe(err), status: post?.status ?? null, fetchError: post?.error ?? null, sessionId: transport.sessionId ?? null };
  });
}

const WHOAMI_SCOPE = 'fixtures:whoami';

/** Sends the browser to the authorization endpoint, after the run is saved; never returns (the page goes away). */
function navigate(run, url, phase) {
  run.state.phase = phase;
  run.save();
  console.log(`[page] navigating to ${url.origin}${url.pathname} (${phase})`);
  location.assign(url.href);
  return new Promise(() => {});
}

async function oauthStart(run) {
  const provider = new BrowserOAuthProvider(run);
  const client = newClient();
  const transport = newTransport(run, { authProvider: provider });
  await run.step('401 → discovery → registration', async () => {
    let err;
    try {
      await client.connect(transport);
    } catch (e) {
      err = e;
    }
    assert(err instanceof UnauthorizedError, `initialize without a token ended with ${err?.name}: ${err?.message}`);
    const reqs = run.state.requests;
    const first = reqs.find((r) => r.url === run.state.server);
    assert(first?.status === 401, 'the first request was not answered 401', first);
    assert(/resource_metadata="/.test(first.challenge ?? ''), 'the page could not read the 401 challenge (WWW-Authenticate exposed?)', first);
    const reg = reqs.find((r) => r.method === 'POST' && r.url.endsWith('/oauth/register'));
    assert(reg?.status === 201, 'the registration was not answered 201', reg);
    assert(provider.clientInformation()?.client_id, 'no client_id');
    assert(provider.pendingRedirect, 'the SDK did not ask to send the user to the authorization endpoint');
    const a = provider.pendingRedirect;
    assert(a.searchParams.get('code_challenge_method') === 'S256', 'no PKCE S256', a.href);
    assert(a.searchParams.get('redirect_uri') === provider.redirectUrl, 'redirect_uri', a.href);
    return {
      challenge: first.challenge,
      metadata: reqs.filter((r) => r.url.includes('/.well-known/')).map((r) => `${r.method} ${new URL(r.url).pathname} ${r.status ?? r.error}`),
      registration: reg.status,
      authorize: `${a.origin}${a.pathname}`,
      scope: a.searchParams.get('scope'),
      resource: a.searchParams.get('resource'),
    };
  });
  return navigate(run, provider.pendingRedirect, 'signed-in');
}

async function callbackStep(run, name) {
  return run.step(name, async () => {
    const q = new URLSearchParams(location.search);
    assert(!q.get('error'), `the authorization endpoint answered ${q.get('error')}: ${q.get('error_description')}`);
    assert(q.get('state') === run.state.provider.state, 'the state that came back is not ours', q.get('state'));
    assert(q.get('code'), 'no code in the callback');
    const serverOrigin = new URL(run.state.server).origin;
    assert(q.get('iss') === serverOrigin, `iss ${q.get('iss')} is not the authorization server ${serverOrigin}`);
    return { iss: q.get('iss'), codeLength: q.get('code').length };
  });
}

async function tokenStep(run, name, transport) {
  return run.step(name, async () => {
    const mark = run.state.requests.length;
    const code = new URLSearchParams(location.search).get('code');
    await transport.finishAuth(code);
    const t = run.state.provider.tokens;
    assert(t?.access_token, 'no access token saved');
    const post = run.requestsSince(mark).find((r) => r.method === 'POST' && r.url.endsWith('/oauth/token'));
    assert(post?.status === 200, 'the token request was not answered 200', post);
    // Back on the app's page: its URL no longer carries the code.
    history.replaceState(null, '', '/');
    return { scope: t.scope, refreshToken: Boolean(t.refresh_token), tokenRequestHeaders: post.headers };
  });
}

async function oauthSignedIn(run) {
  const provider = new BrowserOAuthProvider(run);
  await callbackStep(run, 'callback with the code');
  let transport = newTransport(run, { authProvider: provider });
  await tokenStep(run, 'token', transport);
  const client = newClient();
  transport = newTransport(run, { authProvider: provider });
  await initializeStep(run, client, transport);
  await listAndCallSteps(run, client);
  await run.step('403 insufficient_scope → authorize again', async () => {
    const mark = run.state.requests.length;
    let err;
    try {
      await callTool(client, { name: 'test_whoami', arguments: {} });
    } catch (e) {
      err = e;
    }
    assert(err instanceof UnauthorizedError, `test_whoami without its scope ended with ${err?.name}: ${err?.message}`);
    const forbidden = run.requestsSince(mark).find((r) => r.status === 403);
    assert(forbidden, 'no 403 before the step-up', run.requestsSince(mark));
    assert(/error="insufficient_scope"/.test(forbidden.challenge ?? ''), 'the page could not read the 403 challenge', forbidden);
    assert(provider.pendingRedirect, 'the SDK did not ask to authorize again');
    const scope = provider.pendingRedirect.searchParams.get('scope') ?? '';
    assert(scope.split(' ').includes(WHOAMI_SCOPE), `the step-up asks for ${scope}`);
    return { challenge: forbidden.challenge, scope };
  });
  run.state.session = { id: transport.sessionId, protocolVersion: transport.protocolVersion };
  return navigate(run, provider.pendingRedirect, 'stepped-up');
}

async function oauthSteppedUp(run) {
  const provider = new BrowserOAuthProvider(run);
  await callbackStep(run, 'callback with the step-up code');
  await tokenStep(run, 'token with the wider scope', newTransport(run, { authProvider: provider }));
  const { id, protocolVersion } = run.state.session;
  const client = newClient();
  const transport = newTransport(run, { authProvider: provider, sessionId: id });
  await run.step('test_whoami on the same session', async () => {
    // A transport that has a session id: connect() does not initialize again.
    await client.connect(transport);
    transport.setProtocolVersion(protocolVersion);
    const r = await callTool(client, { name: 'test_whoami', arguments: {} });
    assert(!r.isError, 'test_whoami returned isError', r);
    const who = JSON.parse(firstText(r) ?? 'null');
    assert(who?.scopes?.includes(WHOAMI_SCOPE) && who.scopes.includes('mcp:access'), 'whoami scopes', who);
    return { sub: who.sub, scopes: who.scopes, sameSession: transport.sessionId === id };
  });
  await terminateStep(run, transport);
  await client.close();
}

async function main() {
  const q = new URLSearchParams(location.search);
  let run;
  if (location.pathname === '/callback') {
    run = Run.load();
    if (!run) {
      window.__mcpResult = { ok: false, steps: [{ name: 'callback', ok: false, error: { message: 'a callback without a run in sessionStorage' } }] };
      return;
    }
  } else {
    sessionStorage.removeItem(STORE);
    run = Run.start(q.get('scenario'), q.get('server'));
    run.save();
  }
  try {
    switch (run.state.scenario) {
      case 'session':
        await sessionScenario(run);
        break;
      case 'refused':
        await refusedScenario(run);
        break;
      case 'oauth':
        if (!run.state.phase) await oauthStart(run);
        else if (run.state.phase === 'signed-in') await oauthSignedIn(run);
        else await oauthSteppedUp(run);
        break;
      default:
        throw new Error(`unknown scenario ${run.state.scenario}`);
    }
  } catch (e) {
    if (!(e instanceof StepFailed)) run.state.steps.push({ name: '(page)', ok: false, error: describe(e) });
  }
  run.finish();
}

main();
