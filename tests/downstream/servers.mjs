// The real parts behind the downstream tests (tests/downstream.rs, docs/DOWNSTREAM.md): an OAuth authorization
// server and a downstream API, each a process of its own, so a test can stop one and keep the other.
//
//   node servers.mjs as  --port P --subject-jwks URL --subject-issuer ISS --subject-audience AUD
//                        --audience AUD2 --scope S --ttl SECS --secret SECRET --client-jwk JSON --key-file F
//                        [--redirect-uri URL]   (URL mode: the fleet's callback, for client fleet-post)
//   node servers.mjs api --port P --as-issuer ISS --audience AUD2
//
// `as` is `oidc-provider` (npm, a certified OpenID provider) with RFC 8693 token exchange registered as a grant:
// it authenticates the client the way the client is registered (client_secret_basic, client_secret_post or
// private_key_jwt), verifies the subject token against the fleet's issuer (its JWKS, issuer and audience), checks
// the actor token (a client-credentials token it issued itself) when one is sent, and issues a JWT access token
// for the requested audience, for the same subject, expiring at the earlier of `--ttl` and the subject token's
// expiry. `api` checks every bearer token against the authorization server's JWKS, issuer and audience, and
// answers with the subject and audience it saw. Both count what they did at GET /_stats; `api` answers 401 to a
// subject's next calls after POST /_reject?sub=S&times=N.
//
// Each prints one line, `ready <json>`, on stdout when it listens.

import { readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { importPkg } from '../interop/node/lib.mjs';

const { default: Provider, errors } = await importPkg('oidc-provider');
const { SignJWT, createLocalJWKSet, createRemoteJWKSet, exportJWK, generateKeyPair, importJWK, jwtVerify } =
  await importPkg('jose');

const [role, ...rest] = process.argv.slice(2);
const args = {};
for (let i = 0; i < rest.length; i += 2) args[rest[i].replace(/^--/, '')] = rest[i + 1];
const port = Number(args.port);

const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';

function json(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' });
  res.end(JSON.stringify(body));
}

async function authorizationServer() {
  const issuer = `http://127.0.0.1:${port}`;
  // One signing key for the server's life, kept in --key-file across restarts (the API caches the JWKS).
  let signing;
  try {
    signing = JSON.parse(readFileSync(args['key-file'], 'utf8'));
  } catch {
    const { privateKey } = await generateKeyPair('ES256', { extractable: true });
    signing = { ...(await exportJWK(privateKey)), kid: 'as-1', alg: 'ES256', use: 'sig' };
    writeFileSync(args['key-file'], JSON.stringify(signing));
  }
  const subjectKeys = createRemoteJWKSet(new URL(args['subject-jwks']));
  const ttl = Number(args.ttl ?? 300);
  const allowedScopes = new Set((args.scope ?? '').split(' ').filter(Boolean));
  const stats = { exchanges: 0, refused: 0, client_credentials: 0, by_client: {}, by_subject: {}, actor: 0 };

  const grants = ['client_credentials', TOKEN_EXCHANGE];
  const base = {
    grant_types: grants,
    response_types: [],
    redirect_uris: [],
    scope: [...allowedScopes].join(' '),
    id_token_signed_response_alg: 'ES256',
  };
  const provider = new Provider(issuer, {
    clients: [
      { ...base, client_id: 'fleet-basic', client_secret: args.secret, token_endpoint_auth_method: 'client_secret_basic' },
      {
        ...base,
        client_id: 'fleet-post',
        client_secret: args.secret,
        token_endpoint_auth_method: 'client_secret_post',
        // URL mode: the fleet's callback, when --redirect-uri names it.
        ...(args['redirect-uri']
          ? {
              redirect_uris: [args['redirect-uri']],
              response_types: ['code'],
              grant_types: [...grants, 'authorization_code', 'refresh_token'],
            }
          : {}),
      },
      {
        ...base,
        client_id: 'fleet-jwt',
        token_endpoint_auth_method: 'private_key_jwt',
        token_endpoint_auth_signing_alg: 'ES256',
        jwks: { keys: [JSON.parse(args['client-jwk'])] },
      },
    ],
    jwks: { keys: [signing] },
    features: {
      clientCredentials: { enabled: true },
      // URL mode's consent: oidc-provider's own login and consent pages (any login, no password check).
      devInteractions: { enabled: true },
      // Access tokens are JWTs for --audience, which the API verifies against this server's JWKS.
      resourceIndicators: {
        enabled: true,
        defaultResource: () => args.audience,
        useGrantedResource: () => true,
        getResourceServerInfo: () => ({
          scope: [...allowedScopes].join(' '),
          audience: args.audience,
          accessTokenTTL: ttl,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'ES256' } },
        }),
      },
    },
    scopes: [...allowedScopes],
    ttl: { ClientCredentials: 600, AccessToken: ttl },
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    pkce: { required: () => true },
  });
  const key = await importJWK(signing, 'ES256');

  provider.registerGrantType(
    TOKEN_EXCHANGE,
    async (ctx) => {
      const p = ctx.oidc.params;
      const client = ctx.oidc.client.clientId;
      stats.by_client[client] = (stats.by_client[client] ?? 0) + 1;
      const refuse = (e) => {
        stats.refused += 1;
        throw e;
      };
      if (p.subject_token_type !== ACCESS_TOKEN) refuse(new errors.InvalidRequest('unsupported subject_token_type'));
      if (p.audience !== args.audience) refuse(new errors.InvalidTarget('audience not allowed'));
      let subject;
      try {
        ({ payload: subject } = await jwtVerify(p.subject_token, subjectKeys, {
          issuer: args['subject-issuer'],
          audience: args['subject-audience'],
        }));
      } catch (e) {
        refuse(new errors.InvalidGrant(`subject_token: ${e.code ?? e.message}`));
      }
      if (String(subject.sub).startsWith('blocked-')) refuse(new errors.InvalidGrant('this subject may not delegate'));
      const scopes = (p.scope ?? '').split(' ').filter(Boolean);
      if (scopes.some((s) => !allowedScopes.has(s))) refuse(new errors.InvalidScope('scope not allowed'));
      let act;
      if (p.actor_token !== undefined) {
        if (p.actor_token_type !== ACCESS_TOKEN) refuse(new errors.InvalidRequest('unsupported actor_token_type'));
        // The actor token is this server's own client-credentials token: opaque, or a JWT when it names a resource.
        const opaque = await provider.ClientCredentials.find(p.actor_token).catch(() => undefined);
        let actorClient = opaque?.clientId;
        if (!opaque) {
          const { d, ...pub } = signing;
          const claims = await jwtVerify(p.actor_token, createLocalJWKSet({ keys: [pub] }), { issuer }).catch(() => null);
          actorClient = claims?.payload.client_id;
        }
        if (actorClient !== client) refuse(new errors.InvalidGrant('actor_token'));
        act = { sub: client };
        stats.actor += 1;
      }
      const now = Math.floor(Date.now() / 1000);
      const exp = Math.min(now + ttl, Number(subject.exp));
      const claims = { client_id: client, scope: scopes.join(' ') || undefined, act };
      if (p.resource !== undefined) claims.resource = p.resource;
      const token = await new SignJWT(claims)
        .setProtectedHeader({ alg: 'ES256', kid: signing.kid, typ: 'at+jwt' })
        .setIssuer(issuer)
        .setSubject(String(subject.sub))
        .setAudience(p.audience)
        .setIssuedAt(now)
        .setExpirationTime(exp)
        .setJti(randomUUID())
        .sign(key);
      stats.exchanges += 1;
      stats.by_subject[subject.sub] = (stats.by_subject[subject.sub] ?? 0) + 1;
      ctx.body = {
        access_token: token,
        issued_token_type: ACCESS_TOKEN,
        token_type: 'Bearer',
        expires_in: exp - now,
        scope: scopes.join(' ') || undefined,
      };
    },
    ['subject_token', 'subject_token_type', 'actor_token', 'actor_token_type', 'audience', 'resource', 'scope',
      'requested_token_type'],
    ['audience', 'resource'],
  );
  provider.on('grant.success', (ctx) => {
    const grant = ctx.oidc.params.grant_type;
    if (grant === 'client_credentials') stats.client_credentials += 1;
    if (grant === 'authorization_code') stats.codes = (stats.codes ?? 0) + 1;
    if (grant === 'refresh_token') stats.refreshes = (stats.refreshes ?? 0) + 1;
  });

  const callback = provider.callback();
  const server = http.createServer((req, res) => {
    if (req.url === '/_stats') return json(res, 200, stats);
    return callback(req, res);
  });
  server.listen(port, '127.0.0.1', () => {
    console.log(`ready ${JSON.stringify({ issuer, token_endpoint: `${issuer}/token`, jwks: `${issuer}/jwks` })}`);
  });
}

async function api() {
  const keys = createRemoteJWKSet(new URL(`${args['as-issuer']}/jwks`));
  const stats = { requests: 0, rejected: 0, by_subject: {} };
  const reject = new Map();
  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://api');
    if (url.pathname === '/_stats') return json(res, 200, stats);
    if (url.pathname === '/_reject' && req.method === 'POST') {
      reject.set(url.searchParams.get('sub'), Number(url.searchParams.get('times') ?? 1));
      return json(res, 200, {});
    }
    stats.requests += 1;
    const m = /^Bearer (.+)$/.exec(req.headers.authorization ?? '');
    if (!m) {
      stats.rejected += 1;
      return json(res, 401, { error: 'no token' });
    }
    let claims;
    try {
      ({ payload: claims } = await jwtVerify(m[1], keys, { issuer: args['as-issuer'], audience: args.audience }));
    } catch (e) {
      stats.rejected += 1;
      return json(res, 401, { error: `token: ${e.code ?? e.message}` });
    }
    const left = reject.get(claims.sub) ?? 0;
    if (left > 0) {
      reject.set(claims.sub, left - 1);
      stats.rejected += 1;
      return json(res, 401, { error: 'rejected by the test' });
    }
    stats.by_subject[claims.sub] = (stats.by_subject[claims.sub] ?? 0) + 1;
    if (url.pathname === '/repos' && req.method === 'GET') {
      return json(res, 200, { subject: claims.sub, audience: claims.aud, repos: [{ name: `${claims.sub}/dotfiles` }] });
    }
    if (url.pathname === '/events' && req.method === 'GET') {
      const days = Number(url.searchParams.get('days') ?? 1);
      return json(res, 200, {
        subject: claims.sub,
        audience: claims.aud,
        actor: claims.act?.sub ?? null,
        events: [{ title: `Standup <b>for</b> ${claims.sub}`, in_days: Math.min(days, 1) }],
      });
    }
    return json(res, 404, { error: 'no such route' });
  });
  server.listen(port, '127.0.0.1', () => console.log(`ready ${JSON.stringify({ url: `http://127.0.0.1:${port}` })}`));
}

if (role === 'as') await authorizationServer();
else if (role === 'api') await api();
else {
  console.error('usage: servers.mjs as|api --port P ...');
  process.exit(64);
}
