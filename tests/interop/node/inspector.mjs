#!/usr/bin/env node
// The MCP Inspector's headless CLI (`mcp-inspector --cli URL --transport http --method … --format json`), run with
// the Node 22 of .tools (the Inspector needs Node >= 22.19), against `mcpfleet serve --fixtures conformance`; each
// method's JSON output is asserted. Each invocation is a fresh client process (connect, one method, exit), so
// behind a round-robin proxy every one of them lands its requests on different replicas.
//   --generation 2025  `--protocol-era legacy` (the CLI's default for a URL: initialize + Mcp-Session-Id)
//   --generation 2026  `--protocol-era modern` (server/discover, 2026-07-28 requests)
// Without --generation it runs both and prints one JSON line for each (2025 first).
// The Inspector's catalog and client config go to a temporary HOME that is removed at the end.
//
//   .tools/node_modules/.bin/node tests/interop/node/inspector.mjs --url http://127.0.0.1:PORT/mcp [--generation 2025|2026]
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { assert, assertEq, generationArgs, packageDir, packageVersion, Steps, TOOLS_DIR } from './lib.mjs';

const PKG = '@modelcontextprotocol/inspector';
const { url, generations } = generationArgs();
const NODE = path.join(TOOLS_DIR, 'node_modules', '.bin', 'node');
const dir = packageDir(PKG);
const bin = path.join(dir, JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8')).bin['mcp-inspector']);
const VERSION = packageVersion(PKG);
const home = mkdtempSync(path.join(os.tmpdir(), 'mcp-inspector-home-'));
process.on('exit', () => rmSync(home, { recursive: true, force: true }));
const env = {
  ...process.env,
  HOME: home,
  MCP_CATALOG_PATH: path.join(home, 'mcp.json'),
  MCP_CLIENT_CONFIG_PATH: path.join(home, 'client.json'),
  NO_COLOR: '1',
};

/** One `mcp-inspector --cli` run; resolves { code, stdout, stderr, json }. */
function inspector(args, timeoutMs = 20_000) {
  return new Promise((resolve, reject) => {
    const child = spawn(NODE, [bin, '--cli', ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`mcp-inspector ${args.join(' ')} ran longer than ${timeoutMs} ms; stderr: ${stderr}`));
    }, timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      let json;
      try {
        json = JSON.parse(stdout);
      } catch {
        /* asserted by the caller */
      }
      resolve({ code, stdout, stderr, json });
    });
  });
}

async function run(gen) {
  const S = new Steps({ client: 'inspector-cli', version: VERSION, generation: gen });
  const era = gen === '2026' ? 'modern' : 'legacy';
  const call = async (method, extra = []) => {
    const args = [url, '--transport', 'http', '--protocol-era', era, '--format', 'json', '--method', method, ...extra];
    const r = await inspector(args);
    const cmd = `mcp-inspector --cli ${args.join(' ')}`;
    assert(r.code === 0, `${cmd} exited ${r.code}\nstdout: ${r.stdout.slice(0, 2000)}\nstderr: ${r.stderr.slice(0, 2000)}`);
    assert(r.json && typeof r.json === 'object', `${cmd} printed no JSON object: ${r.stdout.slice(0, 2000)}`);
    assert(r.json.result, `${cmd} printed no result: ${r.stdout.slice(0, 2000)}`);
    return r.json.result;
  };
  const text = (result) => result?.content?.find((c) => c.type === 'text')?.text;

  await S.step('version', async () => {
    const r = await inspector(['--version']);
    assertEq(r.code, 0, 'mcp-inspector --cli --version exit code');
    assert(r.stdout.includes(VERSION), `--version printed ${r.stdout.trim()}, not ${VERSION}`);
    return r.stdout.trim();
  });
  await S.step('tools/list', async () => {
    const r = await call('tools/list');
    const names = (r.tools ?? []).map((t) => t.name);
    for (const n of ['test_simple_text', 'test_sampling', 'test_elicitation', 'test_tool_with_progress']) assert(names.includes(n), `tools/list lacks ${n}`, names);
    const simple = r.tools.find((t) => t.name === 'test_simple_text');
    assertEq(simple.inputSchema?.type, 'object', 'test_simple_text inputSchema.type');
    return `${names.length} tools`;
  });
  await S.step('tools/call', async () => {
    const r = await call('tools/call', ['--tool-name', 'test_simple_text']);
    assert(!r.isError, 'test_simple_text returned isError', r);
    assertEq(text(r), 'This is a simple text response for testing.', 'test_simple_text text');
    // Only 2026-07-28 results carry the server's identity in _meta: proof of the era the CLI spoke.
    const info = r._meta?.['io.modelcontextprotocol/serverInfo'];
    if (gen === '2026') assertEq(info?.name, 'mcpfleet', '_meta serverInfo of a 2026-07-28 result');
    else assertEq(info, undefined, '_meta serverInfo of a session-generation result');
  });
  await S.step('tools/call with arguments', async () => {
    const r = await call('tools/call', ['--tool-name', 'test_countdown', '--tool-args-json', '{"count":3,"interval_ms":20}']);
    assert(!r.isError, 'test_countdown returned isError', r);
    assertEq(text(r), 'counted to 3', 'test_countdown text');
  });
  await S.step('resources/list', async () => {
    const r = await call('resources/list');
    const uris = (r.resources ?? []).map((x) => x.uri);
    assert(uris.includes('test://static-text'), 'resources/list lacks test://static-text', uris);
    return `${uris.length} resources`;
  });
  await S.step('resources/templates/list', async () => {
    const r = await call('resources/templates/list');
    const t = (r.resourceTemplates ?? []).map((x) => x.uriTemplate);
    assert(t.includes('test://template/{id}/data'), 'resources/templates/list lacks test://template/{id}/data', t);
  });
  await S.step('resources/read', async () => {
    const r = await call('resources/read', ['--uri', 'test://static-text']);
    assertEq(r.contents?.map((c) => [c.uri, c.text]), [['test://static-text', 'This is the content of the static text resource.']], 'contents');
  });
  await S.step('prompts/list', async () => {
    const r = await call('prompts/list');
    const names = (r.prompts ?? []).map((p) => p.name);
    for (const n of ['test_simple_prompt', 'test_prompt_with_arguments']) assert(names.includes(n), `prompts/list lacks ${n}`, names);
    return `${names.length} prompts`;
  });
  await S.step('prompts/get', async () => {
    const r = await call('prompts/get', ['--prompt-name', 'test_simple_prompt']);
    assertEq(r.messages?.map((m) => [m.role, m.content?.text]), [['user', 'This is a simple prompt for testing.']], 'test_simple_prompt messages');
  });
  await S.step('prompts/get with arguments', async () => {
    const r = await call('prompts/get', ['--prompt-name', 'test_prompt_with_arguments', '--prompt-args', 'arg1=alpha', 'arg2=beta']);
    assertEq(r.messages?.[0]?.content?.text, "Prompt with arguments: arg1='alpha', arg2='beta'", 'test_prompt_with_arguments text');
  });
  await S.step('error surfaces', async () => {
    // An unknown tool must fail the CLI (non-zero exit, an error envelope), not print a result.
    const r = await inspector([url, '--transport', 'http', '--protocol-era', era, '--format', 'json', '--method', 'tools/call', '--tool-name', 'no_such_tool']);
    assert(r.code !== 0, `calling no_such_tool exited 0: ${r.stdout}`);
    const envelope = r.json ?? JSON.parse(r.stderr.trim().split('\n').at(-1) || 'null');
    assert(envelope?.error, `no error envelope for no_such_tool: stdout ${r.stdout} stderr ${r.stderr}`);
    return `exit ${r.code}, ${envelope.error.code}`;
  });
  return S.summary({ protocolEra: era });
}

for (const gen of generations) {
  console.log(JSON.stringify(await run(gen)));
}
process.exit(0);
