// The OAuth workflow shared by oauth-sdk1.mjs and oauth-client2.mjs, against `mcpfleet serve --fixtures
// conformance --auth dev` (whose embedded authorization server auto-approves consent), with no token to start
// with: the SDK discovers everything from the 401, registers, authorizes with PKCE, and steps up on a 403
// insufficient_scope. The server issues a refresh token only for a grant that includes offline_access, which its
// RFC 8414 metadata lists (and its RFC 9728 metadata does not). The SDK-specific parts come in `sdk`:
//   newClient()                    a Client
//   newTransport(provider, fetch)  a StreamableHTTPClientTransport with that authProvider and fetch
//   finishAuth(transport, provider) redeems the code the provider caught
//   callTool(client, params)
//   isUnauthorized(err)            the SDK's "go and authorize" error (UnauthorizedError)
//   asksOfflineAccess              whether the SDK adds offline_access to its authorization requests by itself
//                                  (SEP-2207: when the server lists it and the client registered refresh_token)
//   refreshesInsteadOfStepUp       the SDK answers a 403 insufficient_scope with a refresh when it holds a refresh
//                                  token (typescript-sdk#2255): the workflow asserts it holds none
import { assert, assertEq, firstText, HeadlessOAuthProvider, recordingFetch } from './lib.mjs';

const WHOAMI_SCOPE = 'fixtures:whoami';
const OFFLINE_ACCESS = 'offline_access';

function scopesOf(s) {
  return new Set((s ?? '').split(/\s+/).filter(Boolean));
}

export async function oauthWorkflow(S, url, sdk, { generation } = {}) {
  const rec = S.recorder ?? recordingFetch();
  S.recorder = rec;
  const origin = new URL(url).origin;
  const logLines = [];
  const notes = [];
  const provider = new HeadlessOAuthProvider({ log: (l) => logLines.push(l) });
  let client = sdk.newClient();
  let transport = sdk.newTransport(provider, rec);

  let prm;
  let asMeta;
  await S.step('401 → discovery → registration → authorization', async () => {
    let err;
    try {
      await client.connect(transport);
    } catch (e) {
      err = e;
    }
    assert(err, 'connect succeeded without a token: is the server running with --auth dev?');
    if (!sdk.isUnauthorized(err)) throw err;
    // The first request was refused with 401 and a challenge naming the resource metadata.
    const first = rec.log.find((x) => x.path.endsWith('/mcp'));
    assertEq(first?.status, 401, 'status of the first MCP request');
    assert(/resource_metadata="[^"]+"/.test(first['www-authenticate'] ?? ''), `401 challenge without resource_metadata: ${first['www-authenticate']}`);
    // RFC 9728 metadata, then the authorization server's RFC 8414 metadata, then registration.
    const prmGet = rec.log.find((x) => x.path.startsWith('/.well-known/oauth-protected-resource') && x.status === 200);
    assert(prmGet, 'no protected resource metadata fetched', rec.log);
    prm = await (await fetch(origin + prmGet.path)).json();
    assert(Array.isArray(prm.authorization_servers) && prm.authorization_servers.length > 0, 'PRM without authorization_servers', prm);
    const issuer = prm.authorization_servers[0];
    assert(!issuer.startsWith('urn:'), `PRM names ${issuer}: not a discoverable authorization server`);
    const asGet = rec.log.find((x) => x.path.startsWith('/.well-known/oauth-authorization-server') || x.path.startsWith('/.well-known/openid-configuration'));
    assertEq(asGet?.status, 200, 'status of the authorization server metadata');
    asMeta = await (await fetch(new URL(asGet.path, issuer))).json();
    assertEq(asMeta.issuer, issuer, 'authorization server metadata issuer (RFC 8414 §3.3)');
    // offline_access is the authorization server's: the resource does not name it.
    assert(asMeta.scopes_supported?.includes(OFFLINE_ACCESS), 'the authorization server metadata does not list offline_access', asMeta.scopes_supported);
    assert(!prm.scopes_supported?.includes(OFFLINE_ACCESS), 'the protected resource metadata lists offline_access', prm.scopes_supported);
    const reg = rec.log.find((x) => x.method === 'POST' && asMeta.registration_endpoint && x.path === new URL(asMeta.registration_endpoint).pathname);
    assert(reg && reg.status >= 200 && reg.status < 300, `dynamic registration answered ${reg?.status}`, rec.log);
    assert(provider.clientInformation()?.client_id, 'no client_id registered');
    // The authorization request: PKCE S256, the resource indicator, the scope the challenge asked for.
    assertEq(provider.authorizations.length, 1, 'authorization requests');
    const a = provider.authorizations[0];
    assertEq(a.origin + a.pathname, asMeta.authorization_endpoint, 'authorization endpoint');
    assertEq(a.searchParams.get('response_type'), 'code', 'response_type');
    assertEq(a.searchParams.get('code_challenge_method'), 'S256', 'code_challenge_method');
    assert((a.searchParams.get('code_challenge') ?? '').length >= 43, 'no PKCE code_challenge');
    assertEq(a.searchParams.get('resource'), prm.resource, 'resource indicator');
    assert(scopesOf(a.searchParams.get('scope')).has('mcp:access'), `authorization scope ${a.searchParams.get('scope')}`);
    assertEq(scopesOf(a.searchParams.get('scope')).has(OFFLINE_ACCESS), Boolean(sdk.asksOfflineAccess), `offline_access in the authorization scope ${a.searchParams.get('scope')}`);
    assert(provider.callback?.get('code'), 'the authorization endpoint gave no code');
    return `issuer ${issuer}, client ${provider.clientInformation().client_id}`;
  });

  await S.step('token exchange', async () => {
    const mark = rec.mark();
    await sdk.finishAuth(transport, provider);
    const t = provider.tokens();
    assert(t?.access_token, 'no access token saved');
    assertEq(String(t.token_type).toLowerCase(), 'bearer', 'token_type');
    const tokenPost = rec.since(mark).find((x) => x.method === 'POST' && x.path === new URL(asMeta.token_endpoint).pathname);
    assertEq(tokenPost?.status, 200, 'token endpoint status');
    // A refresh token comes with an offline_access grant, and only with one.
    assertEq(Boolean(t.refresh_token), scopesOf(t.scope).has(OFFLINE_ACCESS), `refresh token for the grant ${t.scope}`);
    assertEq(Boolean(t.refresh_token), Boolean(sdk.asksOfflineAccess), 'refresh token');
    return `scope ${t.scope ?? '(not echoed)'}, refresh token: ${t.refresh_token ? 'yes' : 'no'}`;
  });

  await S.step('reconnect with the token', async () => {
    client = sdk.newClient();
    transport = sdk.newTransport(provider, rec);
    const mark = rec.mark();
    await client.connect(transport);
    const mcp = rec.since(mark).filter((x) => x.path.endsWith('/mcp'));
    assert(mcp.length > 0 && mcp.every((x) => x.authorization?.startsWith('Bearer ')), 'an MCP request went without the bearer token', mcp);
    assert(!mcp.some((x) => x.status === 401), 'a request with the token got 401', mcp);
    return generation === '2026' ? `era ${client.getProtocolEra?.()}` : `session ${transport.sessionId ? 'yes' : 'no'}`;
  });

  await S.step('list tools', async () => {
    const { tools } = await client.listTools();
    assert(tools.some((t) => t.name === 'test_simple_text'), 'tools/list lacks test_simple_text', tools.map((t) => t.name));
    const r = await sdk.callTool(client, { name: 'test_simple_text', arguments: {} });
    assertEq(firstText(r), 'This is a simple text response for testing.', 'test_simple_text text');
    return `${tools.length} tools`;
  });

  let whoami;
  await S.step('step-up (403 insufficient_scope) and test_whoami', async () => {
    const sessionBefore = transport.sessionId;
    if (sdk.refreshesInsteadOfStepUp) {
      assert(!provider.tokens()?.refresh_token, 'the SDK holds a refresh token: it will refresh instead of stepping up (typescript-sdk#2255)');
    }
    const mark = rec.mark();
    let r;
    try {
      r = await sdk.callTool(client, { name: 'test_whoami', arguments: {} });
    } catch (e) {
      // The SDK re-ran the authorization for the wider scope and "redirected" the user: redeem the new code
      // and send the call again (the interactive pattern; same client and transport).
      if (!sdk.isUnauthorized(e)) throw e;
      await sdk.finishAuth(transport, provider);
      r = await sdk.callTool(client, { name: 'test_whoami', arguments: {} });
    }
    const forbidden = rec.since(mark).find((x) => x.status === 403);
    assert(forbidden, 'test_whoami was not refused with 403 first (did the first token already carry fixtures:whoami?)', rec.since(mark));
    // The SDK authorized again by itself: one token request (the new code), no refresh before it.
    const seq = rec.since(mark).map((x) => `${x.method} ${x.path.split('?')[0]} ${x.status}`);
    const tokenPath = new URL(asMeta.token_endpoint).pathname;
    assertEq(seq.filter((x) => x.startsWith(`POST ${tokenPath} `)), [`POST ${tokenPath} 200`], `token requests during the step-up (${seq.join(', ')})`);
    const ch = forbidden['www-authenticate'] ?? '';
    assert(/error="insufficient_scope"/.test(ch), `403 challenge: ${ch}`);
    const chScope = /scope="([^"]*)"/.exec(ch)?.[1];
    assert(scopesOf(chScope).has(WHOAMI_SCOPE) && scopesOf(chScope).has('mcp:access'), `403 challenge scope: ${chScope}`);
    assertEq(provider.authorizations.length, 2, 'authorization requests (the first, then the step-up)');
    const stepUpScope = scopesOf(provider.authorizations[1].searchParams.get('scope'));
    assert(stepUpScope.has(WHOAMI_SCOPE), `step-up authorization scope ${[...stepUpScope].join(' ')}`);
    assertEq(stepUpScope.has(OFFLINE_ACCESS), Boolean(sdk.asksOfflineAccess), `offline_access in the step-up authorization scope ${[...stepUpScope].join(' ')}`);
    assertEq(Boolean(provider.tokens()?.refresh_token), Boolean(sdk.asksOfflineAccess), 'refresh token after the step-up');
    assert(!r.isError, 'test_whoami returned isError', r);
    whoami = JSON.parse(firstText(r) ?? 'null');
    assert(whoami?.sub, 'whoami without sub', whoami);
    assert(Array.isArray(whoami.scopes) && whoami.scopes.includes(WHOAMI_SCOPE) && whoami.scopes.includes('mcp:access'), `whoami scopes ${JSON.stringify(whoami.scopes)}`);
    assert(typeof whoami.iss === 'string' && whoami.iss.length > 0, 'whoami without iss', whoami);
    if (whoami.iss !== asMeta.issuer) {
      // RFC 9068 §2.2 / §4: a JWT access token's iss is the authorization server's issuer identifier, the one its
      // RFC 8414 metadata names. Clients do not check it (the token is opaque to them), so this is a note.
      notes.push(`access token iss ${JSON.stringify(whoami.iss)} differs from the authorization server metadata issuer ${JSON.stringify(asMeta.issuer)} (RFC 9068 §2.2)`);
    }
    if (sessionBefore) assertEq(transport.sessionId, sessionBefore, 'the session after step-up (sessions key on iss+sub, not the token)');
    if (sdk.refreshesInsteadOfStepUp) {
      notes.push(
        'SDK 1.x stepped up by itself: it asked for the challenge\'s scope only, so the server issued no refresh token, and on 403 ' +
          'insufficient_scope its auth() had nothing to refresh and authorized again. A 1.x client that asks for offline_access ' +
          'would get a refresh token and then refresh instead of stepping up, which cannot widen the grant: 403 again, ' +
          '"Server returned 403 after trying upscoping" (typescript-sdk#2255)',
      );
    }
    return `sub ${whoami.sub}, scopes ${whoami.scopes.join(' ')}; ${seq.join(', ')}`;
  });

  if (transport.sessionId) {
    await S.step('terminate session', async () => {
      const mark = rec.mark();
      await transport.terminateSession();
      const del = rec.since(mark).filter((x) => x.method === 'DELETE');
      assert(del.length === 1 && del[0].status >= 200 && del[0].status < 300, `DELETE answered ${del[0]?.status}`);
    });
  }
  await client.close();
  return { whoami: { sub: whoami.sub, scopes: whoami.scopes, iss: whoami.iss, client_id: whoami.client_id }, notes, flow: logLines };
}
