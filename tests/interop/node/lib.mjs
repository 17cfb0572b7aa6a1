// Shared helpers of the interop workflows: loading the official packages from .tools/node_modules (these scripts
// live outside .tools, so Node's own resolution would not find them), a step runner that asserts and reports, a
// fetch that records what went over the wire, and an in-memory OAuth client provider.
import { createRequire } from 'node:module';
import { readFileSync, existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { withDeadline } from './deadline.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
/** The npm tools directory: `.tools` at the workspace root, or `$MCP_TOOLS_DIR`. */
export const TOOLS_DIR = path.resolve(process.env.MCP_TOOLS_DIR ?? path.join(here, '..', '..', '..', '.tools'));
const toolsRequire = createRequire(path.join(TOOLS_DIR, 'package.json'));

/** The directory of an installed package, found the way Node would from `.tools/package.json`. */
export function packageDir(name) {
  // The node_modules directories Node would search from .tools, in its order; a package's entry point may not
  // exist (the SDK 1.x exports "." to a file it does not ship), so look for its package.json instead.
  for (const dir of toolsRequire.resolve.paths(name) ?? []) {
    const pj = path.join(dir, name, 'package.json');
    if (existsSync(pj)) return path.dirname(pj);
  }
  throw new Error(`${name} is not installed under ${TOOLS_DIR} (run npm install there)`);
}

/** The installed version of a package. */
export function packageVersion(name) {
  return JSON.parse(readFileSync(path.join(packageDir(name), 'package.json'), 'utf8')).version;
}

// Picks the ESM target of an exports entry (conditions import → node → default), recursing into nested conditions.
function pickTarget(entry) {
  if (typeof entry === 'string') return entry;
  if (Array.isArray(entry)) {
    for (const e of entry) {
      const t = pickTarget(e);
      if (t) return t;
    }
    return undefined;
  }
  if (entry && typeof entry === 'object') {
    for (const cond of ['import', 'node', 'default']) {
      if (cond in entry) {
        const t = pickTarget(entry[cond]);
        if (t) return t;
      }
    }
  }
  return undefined;
}

/**
 * The ES module file of `name` + `subpath` (like `./client/index.js`), resolved through the package's `exports` map
 * with the `import` condition (Node's createRequire only knows `require`, which would load the CommonJS build:
 * mixing both builds would give two copies of every class, and `instanceof` across them fails).
 */
export function resolveImport(name, subpath = '.') {
  const dir = packageDir(name);
  const pj = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8'));
  const exp = pj.exports;
  let target;
  if (exp === undefined) {
    target = subpath === '.' ? (pj.module ?? pj.main ?? 'index.js') : subpath;
  } else if (typeof exp === 'string' || Array.isArray(exp) || !Object.keys(exp).some((k) => k.startsWith('.'))) {
    if (subpath === '.') target = pickTarget(exp);
  } else if (subpath in exp) {
    target = pickTarget(exp[subpath]);
  } else {
    // Subpath patterns ("./*": "./dist/esm/*"): the longest matching prefix wins.
    let best;
    for (const key of Object.keys(exp)) {
      const star = key.indexOf('*');
      if (star < 0) continue;
      const [pre, post] = [key.slice(0, star), key.slice(star + 1)];
      if (subpath.startsWith(pre) && subpath.endsWith(post) && subpath.length >= key.length - 1) {
        if (!best || pre.length > best.pre.length) best = { key, pre, post };
      }
    }
    if (best) {
      const t = pickTarget(exp[best.key]);
      const matched = subpath.slice(best.pre.length, subpath.length - best.post.length);
      target = t?.replaceAll('*', matched);
    }
  }
  if (!target) throw new Error(`${name} does not export ${subpath} for import`);
  return path.join(dir, target);
}

/** `import()` of a package's ES module, resolved from `.tools/node_modules`. */
export function importPkg(name, subpath = '.') {
  return import(pathToFileURL(resolveImport(name, subpath)).href);
}

/** Command-line options: `--url URL` and whatever `extra` declares (node:util parseArgs options). */
export function cliArgs(extra = {}) {
  const { values } = parseArgs({ options: { url: { type: 'string' }, ...extra }, allowPositionals: false });
  if (!values.url) {
    console.error(`usage: ${path.basename(process.argv[1])} --url http://HOST:PORT/mcp`);
    process.exit(64);
  }
  return values;
}

/**
 * Command-line options of a script that runs in both protocol generations: `--url URL [--generation 2025|2026]`.
 * `generations` is the one asked for, or both (2025 first) without the flag.
 */
export function generationArgs() {
  const { url, generation } = cliArgs({ generation: { type: 'string' } });
  if (generation !== undefined && !['2025', '2026'].includes(generation)) {
    console.error('--generation must be 2025 or 2026');
    process.exit(64);
  }
  return { url, generations: generation ? [generation] : ['2025', '2026'] };
}

export class AssertionError extends Error {}

export function assert(cond, message, detail) {
  if (!cond) {
    const e = new AssertionError(message);
    if (detail !== undefined) e.detail = detail;
    throw e;
  }
}

/** JSON with object keys sorted, so that comparisons ignore key order. */
export function canonical(v) {
  return JSON.stringify(v, (_, x) =>
    x && typeof x === 'object' && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : x,
  );
}

export function assertEq(actual, expected, what) {
  const a = canonical(actual);
  const b = canonical(expected);
  assert(a === b, `${what}: expected ${b}, got ${a}`);
}

/** The text of the first text content block of a tool result (or a prompt message). */
export function firstText(result) {
  const block = (result?.content ?? []).find((c) => c.type === 'text');
  return block?.text;
}

function describe(err) {
  if (!err) return String(err);
  const parts = [err.stack ?? String(err)];
  for (const k of ['code', 'data', 'detail', 'cause']) {
    if (err[k] !== undefined) {
      let v = err[k];
      if (k === 'cause' && v instanceof Error) v = v.stack ?? String(v);
      parts.push(`${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}`);
    }
  }
  return parts.join('\n  ');
}

/**
 * Runs named steps in order, each asserted; the first failure prints what failed (and what went over the wire
 * lately, if a recorder is given) and exits 1. A watchdog fails the run if a step hangs.
 */
export class Steps {
  constructor({ client, version, generation, deadlineMs = 55_000, recorder } = {}) {
    Object.assign(this, { client, version, generation, recorder });
    this.steps = [];
    this.skipped = [];
    this.current = undefined;
    this.started = Date.now();
    this.watchdog = setTimeout(() => {
      this.fail(this.current ?? '(between steps)', new Error(`the run took longer than ${deadlineMs} ms`));
    }, deadlineMs);
    this.watchdog.unref();
  }

  async step(name, fn, { timeoutMs = 30_000 } = {}) {
    this.current = name;
    const t0 = Date.now();
    try {
      const detail = await withDeadline(fn, timeoutMs);
      const s = { name, ok: true, ms: Date.now() - t0 };
      if (detail !== undefined) s.detail = detail;
      this.steps.push(s);
      return detail;
    } catch (err) {
      this.fail(name, err);
    } finally {
      this.current = undefined;
    }
  }

  skip(name, reason) {
    this.skipped.push({ name, reason });
  }

  fail(name, err) {
    const tag = this.generation ? `${this.client} ${this.version} (${this.generation})` : `${this.client} ${this.version}`;
    console.error(`FAIL ${tag}: step "${name}": ${describe(err)}`);
    if (this.recorder) {
      const tail = this.recorder.log.slice(-12);
      if (tail.length) console.error(`last HTTP exchanges:\n${tail.map((r) => '  ' + JSON.stringify(r)).join('\n')}`);
    }
    console.error(`passed before it: ${this.steps.map((s) => s.name).join(', ') || '(none)'}`);
    process.exit(1);
  }

  summary(extra = {}) {
    clearTimeout(this.watchdog);
    const out = { client: this.client, version: this.version };
    if (this.generation) out.generation = this.generation;
    Object.assign(out, extra, { steps: this.steps });
    if (this.skipped.length) out.skipped = this.skipped;
    out.ms = Date.now() - this.started;
    return out;
  }

  /** Prints the one final JSON line. */
  done(extra = {}) {
    console.log(JSON.stringify(this.summary(extra)));
  }
}

/**
 * A fetch that records every exchange (method, URL path, the headers that matter here, status, content type),
 * so that a workflow can assert what the SDK did on the wire: the Last-Event-ID of a resumption, the DELETE's
 * status, the token that was sent.
 */
export function recordingFetch(base = globalThis.fetch) {
  const log = [];
  const f = async (input, init = {}) => {
    const req = new Request(input, init);
    const url = new URL(req.url);
    const h = req.headers;
    const rec = { method: req.method, path: url.pathname + url.search };
    for (const k of ['mcp-session-id', 'last-event-id', 'mcp-protocol-version', 'mcp-method', 'mcp-name']) {
      if (h.get(k)) rec[k] = h.get(k);
    }
    if (h.get('authorization')) rec.authorization = h.get('authorization').slice(0, 16) + '…';
    if (req.method === 'POST' && url.pathname.endsWith('/mcp') && typeof init.body === 'string') {
      try {
        const m = JSON.parse(init.body);
        rec.rpc = Array.isArray(m) ? m.map((x) => x.method ?? 'response') : (m.method ?? (m.result ? 'result' : m.error ? 'error' : '?'));
      } catch {
        /* not JSON */
      }
    }
    log.push(rec);
    try {
      const res = await base(input, init);
      rec.status = res.status;
      const ct = res.headers.get('content-type');
      if (ct) rec.type = ct.split(';')[0];
      if (res.headers.get('www-authenticate')) rec['www-authenticate'] = res.headers.get('www-authenticate');
      return res;
    } catch (e) {
      rec.error = String(e?.message ?? e);
      throw e;
    }
  };
  f.log = log;
  f.mark = () => log.length;
  f.since = (mark) => log.slice(mark);
  return f;
}

/** What the client's "model" answers to sampling/createMessage. */
export function samplingAnswer(params) {
  const last = params?.messages?.at(-1)?.content;
  const prompt = Array.isArray(last) ? last.find((c) => c.type === 'text')?.text : last?.text;
  return { model: 'interop-echo', role: 'assistant', content: { type: 'text', text: `echo: ${prompt ?? ''}` }, stopReason: 'endTurn' };
}

/** What the client's "user" answers to elicitation/create: fills every field the form asks for. */
export function elicitationAnswer(params) {
  const props = params?.requestedSchema?.properties ?? {};
  const content = {};
  for (const [k, s] of Object.entries(props)) {
    if (s.type === 'boolean') content[k] = true;
    else if (s.type === 'integer' || s.type === 'number') content[k] = 1;
    else if (s.type === 'array') content[k] = [];
    else if (k === 'email') content[k] = 'interop@example.com';
    else content[k] = `interop-${k}`;
  }
  return { action: 'accept', content };
}

/**
 * An in-memory OAuthClientProvider (the interface is the same in SDK 1.x and client 2.x) for a headless client:
 * dynamic registration as a public client with a loopback redirect URI, and `redirectToAuthorization` that
 * "opens the browser" by fetching the authorization URL without following redirects; the consent auto-approves,
 * so the answer is a redirect to our redirect URI whose `code` (and `iss`, `state`) it keeps for `finishAuth`.
 */
export class HeadlessOAuthProvider {
  constructor({ redirectUrl = 'http://127.0.0.1:33418/callback', scope, clientName = 'mcpfleet-interop', log = () => {} } = {}) {
    this._redirectUrl = redirectUrl;
    this._scope = scope;
    this._clientName = clientName;
    this._log = log;
    this._clientInformation = undefined;
    this._tokens = undefined;
    this._codeVerifier = undefined;
    this._discoveryState = undefined;
    this._state = undefined;
    this.authorizations = []; // every authorization URL we were sent to, for the workflow to assert on
    this.callback = undefined; // URLSearchParams of the last redirect back to us
  }

  get redirectUrl() {
    return this._redirectUrl;
  }

  get clientMetadata() {
    const m = {
      client_name: this._clientName,
      redirect_uris: [this._redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
    if (this._scope) m.scope = this._scope;
    return m;
  }

  state() {
    this._state = Math.random().toString(36).slice(2) + Math.random().toString(36).slice(2);
    return this._state;
  }

  clientInformation() {
    return this._clientInformation;
  }

  saveClientInformation(info) {
    this._log(`registered client_id=${info.client_id}`);
    this._clientInformation = info;
  }

  tokens() {
    return this._tokens;
  }

  saveTokens(tokens) {
    this._log(`saved tokens: scope=${tokens.scope ?? '(none)'} refresh=${tokens.refresh_token ? 'yes' : 'no'}`);
    this._tokens = tokens;
  }

  saveCodeVerifier(v) {
    this._codeVerifier = v;
  }

  codeVerifier() {
    if (!this._codeVerifier) throw new Error('no code verifier saved');
    return this._codeVerifier;
  }

  saveDiscoveryState(s) {
    this._discoveryState = s;
  }

  discoveryState() {
    return this._discoveryState;
  }

  invalidateCredentials(scope) {
    this._log(`invalidateCredentials(${scope})`);
    if (scope === 'all' || scope === 'client') this._clientInformation = undefined;
    if (scope === 'all' || scope === 'tokens') this._tokens = undefined;
    if (scope === 'all' || scope === 'verifier') this._codeVerifier = undefined;
    if (scope === 'all' || scope === 'discovery') this._discoveryState = undefined;
  }

  async redirectToAuthorization(authorizationUrl) {
    const url = new URL(authorizationUrl);
    this.authorizations.push(url);
    this._log(`authorize: ${url.origin}${url.pathname} scope=${url.searchParams.get('scope')}`);
    const res = await fetch(url, { redirect: 'manual' });
    const location = res.headers.get('location');
    if (res.status < 300 || res.status >= 400 || !location) {
      const body = await res.text().catch(() => '');
      throw new Error(`the authorization endpoint answered ${res.status} without a redirect: ${body.slice(0, 300)}`);
    }
    await res.body?.cancel();
    const back = new URL(location, url);
    const expected = new URL(this._redirectUrl);
    if (back.origin + back.pathname !== expected.origin + expected.pathname) {
      throw new Error(`the authorization endpoint redirected to ${back.href}, not to our redirect URI`);
    }
    if (back.searchParams.get('error')) {
      throw new Error(`authorization refused: ${back.searchParams.get('error')} ${back.searchParams.get('error_description') ?? ''}`);
    }
    if (this._state && back.searchParams.get('state') !== this._state) {
      throw new Error(`the authorization response's state ${back.searchParams.get('state')} is not ours`);
    }
    if (!back.searchParams.get('code')) throw new Error(`no code in the redirect: ${back.href}`);
    this.callback = back.searchParams;
  }
}
