#!/usr/bin/env node
// A plain round-robin HTTP proxy for manual interop runs: every request goes to the next upstream in turn (no
// stickiness of any kind), request and response bodies are streamed both ways, and the Host header is passed
// through unchanged (so the server sees the URL the client used, as behind a real load balancer). When the client
// goes away, the upstream request is torn down too (a closed SSE stream stays closed).
//
//   node rr-proxy.mjs --listen 127.0.0.1:0 --upstream 127.0.0.1:8081,127.0.0.1:8082,127.0.0.1:8083
//
// Prints `listening http://HOST:PORT` as its first stdout line. `--log` prints one line per request.
import http from 'node:http';

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const [lhost, lport] = opt('--listen', '127.0.0.1:0').split(':');
const upstreams = (opt('--upstream', '') || '').split(',').filter(Boolean).map((u) => {
  const [host, port] = u.split(':');
  return { host, port: Number(port) };
});
const log = args.includes('--log');
if (upstreams.length === 0) {
  console.error('usage: rr-proxy.mjs --listen HOST:PORT --upstream HOST:PORT[,HOST:PORT...] [--log]');
  process.exit(64);
}

let next = 0;
const server = http.createServer((req, res) => {
  const i = next++ % upstreams.length;
  const up = upstreams[i];
  const upReq = http.request(
    { host: up.host, port: up.port, method: req.method, path: req.url, headers: req.headers },
    (upRes) => {
      if (log) console.log(`${req.method} ${req.url} -> #${i} ${upRes.statusCode} ${upRes.headers['content-type'] ?? ''}`);
      res.writeHead(upRes.statusCode ?? 502, upRes.rawHeaders);
      res.flushHeaders();
      upRes.pipe(res);
      upRes.on('error', () => res.destroy());
    },
  );
  upReq.on('error', (e) => {
    if (!res.headersSent) {
      res.writeHead(502, { 'content-type': 'text/plain' });
      res.end(`upstream #${i} failed: ${e.message}`);
    } else {
      res.destroy();
    }
  });
  // The client hung up (or the response ended): never keep an upstream stream open on its behalf.
  res.on('close', () => upReq.destroy());
  req.pipe(upReq);
});
server.keepAliveTimeout = 5000;
server.listen(Number(lport), lhost, () => {
  const a = server.address();
  console.log(`listening http://${a.address}:${a.port}`);
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
