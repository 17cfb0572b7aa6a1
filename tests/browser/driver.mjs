#!/usr/bin/env node
// The browser test's driver (tests/browser.rs): bundles page.mjs and the official TypeScript SDK 1.x for the browser
// with esbuild (into a temp dir), serves the page from a loopback port of its own, so from another origin than the
// MCP server's, and drives Debian's Chromium with puppeteer-core through each scenario asked for. It prints one JSON
// line: {"driver":"browser","sdk":…,"browser":…,"webSecurity":…,"runs":[{scenario, origin, ok, steps, requests,
// console, pageErrors, network}]}, and exits 0 whenever each run reported (the Rust test judges the steps); 1 when
// the harness itself failed (no Chromium, the bundle, a page that never reported).
//
//   .tools/node_modules/.bin/node tests/browser/driver.mjs --url http://127.0.0.1:PORT/mcp --run session@localhost
//
//   --run SCENARIO@HOST   a scenario of page.mjs (session, oauth, refused) on the page origin http://HOST:<page port>;
//                         repeatable, run in order in one browser
//   --show URL            after the runs, opens URL as a person would (a navigation) and reports what the page
//                         shows: {url, status, contentType, title, text, scripts, dialogs}, in "shown"
//   --disable-web-security  a debugging switch: Chromium without CORS (and the same-origin policy), to try the
//                         harness against a server without CORS. Never in the test.
//   --chromium PATH       the browser (default /usr/bin/chromium, or $CHROMIUM)
//   --timeout MS          per run (default 45000)
import { mkdtempSync, rmSync, writeFileSync, readFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { importPkg, packageDir, packageVersion, TOOLS_DIR } from '../interop/node/lib.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    run: { type: 'string', multiple: true },
    show: { type: 'string', multiple: true },
    'disable-web-security': { type: 'boolean', default: false },
    chromium: { type: 'string' },
    timeout: { type: 'string', default: '45000' },
  },
});
if (!values.url || !(values.run?.length || values.show?.length)) {
  console.error('usage: driver.mjs --url http://127.0.0.1:PORT/mcp --run SCENARIO@HOST [--run …] [--show URL …] [--disable-web-security]');
  process.exit(64);
}
const runs = (values.run ?? []).map((r) => {
  const [scenario, host = 'localhost'] = r.split('@');
  return { scenario, host };
});
const executablePath = values.chromium ?? process.env.CHROMIUM ?? '/usr/bin/chromium';
const perRunMs = Number(values.timeout);

function harnessFailure(what, err) {
  console.error(`FAIL browser driver: ${what}: ${err?.stack ?? err}`);
  process.exit(1);
}

// 1. The bundle: page.mjs and the SDK it imports, for the browser, into a temp dir.
const dir = mkdtempSync(path.join(os.tmpdir(), 'mcpfleet-browser-'));
process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
try {
  const esbuild = await importPkg('esbuild');
  await (esbuild.build ?? esbuild.default.build)({
    entryPoints: [path.join(here, 'page.mjs')],
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: 'chrome120',
    outfile: path.join(dir, 'page.js'),
    nodePaths: [path.join(TOOLS_DIR, 'node_modules')],
    sourcemap: 'inline',
    logLevel: 'error',
  });
} catch (e) {
  harnessFailure('esbuild could not bundle page.mjs', e);
}
writeFileSync(
  path.join(dir, 'index.html'),
  '<!doctype html><html><head><meta charset="utf-8"><title>mcpfleet browser test</title></head>' +
    '<body><p>mcpfleet browser test</p><script type="module" src="/page.js"></script></body></html>',
);

// 2. The page's own server, on loopback: every path is the app (its /callback included), but /page.js.
const pageServer = http.createServer((req, res) => {
  const { pathname } = new URL(req.url, 'http://x');
  const [file, type] = pathname === '/page.js' ? ['page.js', 'text/javascript'] : ['index.html', 'text/html; charset=utf-8'];
  res.writeHead(200, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(readFileSync(path.join(dir, file)));
});
await new Promise((resolve, reject) => pageServer.listen(0, '127.0.0.1', resolve).on('error', reject));
const pagePort = pageServer.address().port;

// 3. Chromium.
let browser;
try {
  const puppeteer = await importPkg('puppeteer-core');
  const args = ['--no-sandbox', '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check'];
  if (values['disable-web-security']) args.push('--disable-web-security');
  browser = await (puppeteer.default ?? puppeteer).launch({
    executablePath,
    headless: true,
    args,
    userDataDir: path.join(dir, 'profile'),
  });
} catch (e) {
  harnessFailure(`cannot start ${executablePath} (tests/run-all.sh installs Debian's chromium)`, e);
}

/**
 * The network as Chromium saw it (CDP), preflights included: per request the method, URL, resource type, the
 * request headers as sent (Origin, Access-Control-Request-*), the status and every response header (exposed or
 * not), and why it failed (the CORS error Chromium names).
 */
async function networkLog(page) {
  const cdp = await page.createCDPSession();
  const byId = new Map();
  const log = [];
  const entry = (id) => {
    let e = byId.get(id);
    if (!e) {
      e = { id };
      byId.set(id, e);
      log.push(e);
    }
    return e;
  };
  cdp.on('Network.requestWillBeSent', (ev) => {
    // A redirect reuses the request id: keep the hop that was redirected as an entry of its own.
    if (ev.redirectResponse && byId.has(ev.requestId)) {
      const prev = byId.get(ev.requestId);
      prev.status = ev.redirectResponse.status;
      prev.responseHeaders = ev.redirectResponse.headers;
      prev.id = `${ev.requestId}/redirected`;
      byId.delete(ev.requestId);
    }
    const e = entry(ev.requestId);
    Object.assign(e, { method: ev.request.method, url: ev.request.url.split('?')[0], type: ev.type });
    e.requestHeaders = { ...ev.request.headers, ...e.requestHeaders };
  });
  cdp.on('Network.requestWillBeSentExtraInfo', (ev) => {
    const e = entry(ev.requestId);
    e.requestHeaders = { ...e.requestHeaders, ...ev.headers };
  });
  cdp.on('Network.responseReceived', (ev) => {
    const e = entry(ev.requestId);
    e.status = ev.response.status;
    e.responseHeaders = { ...ev.response.headers, ...e.responseHeaders };
  });
  cdp.on('Network.responseReceivedExtraInfo', (ev) => {
    const e = entry(ev.requestId);
    e.status ??= ev.statusCode;
    e.responseHeaders = { ...e.responseHeaders, ...ev.headers };
  });
  cdp.on('Network.loadingFailed', (ev) => {
    const e = entry(ev.requestId);
    e.failed = ev.errorText;
    if (ev.corsErrorStatus) e.cors = ev.corsErrorStatus;
    if (ev.blockedReason) e.blocked = ev.blockedReason;
  });
  await cdp.send('Network.enable');
  // Only the traffic of the test: not the page's own files.
  return () => log.filter((e) => e.url && !e.url.startsWith(`http://localhost:${pagePort}/`) && !e.url.startsWith(`http://127.0.0.1:${pagePort}/`));
}

async function oneRun({ scenario, host }) {
  const page = await browser.newPage();
  const consoleLines = [];
  const pageErrors = [];
  page.on('console', (m) => consoleLines.push({ type: m.type(), text: m.text(), url: m.location()?.url }));
  page.on('pageerror', (e) => pageErrors.push(String(e?.stack ?? e)));
  const network = await networkLog(page);
  const origin = `http://${host}:${pagePort}`;
  const start = `${origin}/?scenario=${encodeURIComponent(scenario)}&server=${encodeURIComponent(values.url)}`;
  const deadline = Date.now() + perRunMs;
  let result;
  try {
    await page.goto(start, { waitUntil: 'domcontentloaded' });
    // The page may navigate (the OAuth scenario goes to the authorization endpoint and back): poll until it reports.
    while (!result && Date.now() < deadline) {
      try {
        result = await page.evaluate(() => window.__mcpResult ?? null);
      } catch {
        /* between two documents */
      }
      if (!result) await new Promise((r) => setTimeout(r, 100));
    }
  } catch (e) {
    pageErrors.push(`driver: ${e?.stack ?? e}`);
  }
  if (!result) {
    // What the page had done when time ran out (its state, if the page is ours).
    let partial;
    try {
      partial = await page.evaluate(() => sessionStorage.getItem('mcpfleet-browser-test'));
    } catch {
      /* another origin, or gone */
    }
    const state = partial ? JSON.parse(partial) : {};
    result = {
      scenario,
      origin,
      ok: false,
      timedOut: true,
      at: page.url().split('?')[0],
      steps: state.steps ?? [],
      requests: state.requests ?? [],
    };
  }
  await page.close();
  return { ...result, scenario, origin, console: consoleLines, pageErrors, network: network() };
}

/** What a person sees at `url`: the answer's status and type, the document's title and text, its scripts. */
async function show(url) {
  const page = await browser.newPage();
  const dialogs = [];
  page.on('dialog', async (d) => {
    dialogs.push(d.message());
    await d.dismiss();
  });
  try {
    const res = await page.goto(url, { waitUntil: 'load' });
    const doc = await page.evaluate(() => ({ title: document.title, text: document.body?.innerText ?? '', scripts: document.scripts.length }));
    return { url, status: res?.status(), contentType: res?.headers()['content-type'], ...doc, dialogs };
  } catch (e) {
    return { url, error: String(e?.stack ?? e), dialogs };
  } finally {
    await page.close();
  }
}

const out = [];
for (const r of runs) out.push(await oneRun(r));
const shown = [];
for (const url of values.show ?? []) shown.push(await show(url));
const version = await browser.version();
await browser.close();
pageServer.close();
console.log(
  JSON.stringify({
    driver: 'browser',
    sdk: packageVersion('@modelcontextprotocol/sdk'),
    puppeteer: packageVersion('puppeteer-core'),
    esbuild: packageVersion('esbuild'),
    browser: version,
    webSecurity: !values['disable-web-security'],
    pagePort,
    runs: out,
    shown,
  }),
);
// The packages came from .tools (lib.mjs); say where, for a reader of a failure.
console.error(`browser driver: ${executablePath}, packages from ${path.dirname(packageDir('puppeteer-core'))}`);
process.exit(out.some((r) => r.timedOut) ? 1 : 0);
