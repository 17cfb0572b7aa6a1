#!/usr/bin/env python3
"""A tiny round-robin HTTP/1.1 proxy for manual interop testing (not used by CI).

Every request goes to the next backend in turn: no stickiness, no session affinity, so one MCP session's
`initialize`, `tools/call`, answer POSTs and resuming GETs land on different replicas. Response bodies (SSE
included) are streamed through byte for byte as they arrive. Each client connection carries one request
(the proxy answers `Connection: close`), which is all a round-robin test needs.

    python3 rr_proxy.py --listen 127.0.0.1:9000 --backend 127.0.0.1:9001 --backend 127.0.0.1:9002 ...

Standard library only. Logs one line per request to stderr with --verbose.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"upgrade",
}


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, list[tuple[bytes, bytes]]] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head[:-4].split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


async def read_body(reader: asyncio.StreamReader, headers: list[tuple[bytes, bytes]]) -> bytes:
    lower = {k.lower(): v for k, v in headers}
    if lower.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                # Skip trailers until the empty line.
                while chunk != b"\r\n":
                    chunk = await reader.readuntil(b"\r\n")
                return bytes(body)
            body += chunk[:-2]
    length = int(lower.get(b"content-length", b"0") or b"0")
    return await reader.readexactly(length) if length else b""


class Proxy:
    def __init__(self, backends: list[tuple[str, int]], verbose: bool) -> None:
        self.backends = backends
        self.next = itertools.cycle(range(len(backends)))
        self.verbose = verbose

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        backend_w: asyncio.StreamWriter | None = None
        try:
            parsed = await read_head(client_r)
            if parsed is None:
                return
            request_line, headers = parsed
            body = await read_body(client_r, headers)
            index = next(self.next)
            host, port = self.backends[index]
            if self.verbose:
                print(f"rr_proxy: {request_line.decode(errors='replace')} -> {host}:{port}", file=sys.stderr)
            try:
                backend_r, backend_w = await asyncio.open_connection(host, port)
            except OSError:
                client_w.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                await client_w.drain()
                return
            out = bytearray(request_line + b"\r\n")
            for name, value in headers:
                low = name.lower()
                if low in HOP_BY_HOP or low in (b"content-length", b"transfer-encoding"):
                    continue
                out += name + b": " + value + b"\r\n"
            out += b"content-length: " + str(len(body)).encode() + b"\r\n"
            out += b"connection: close\r\n\r\n" + body
            backend_w.write(out)
            await backend_w.drain()
            # Stream the response through as it comes: the backend closes after it (connection: close).
            while True:
                data = await backend_r.read(65536)
                if not data:
                    break
                client_w.write(data)
                await client_w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            for w in (backend_w, client_w):
                if w is not None:
                    w.close()


def hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host or "127.0.0.1", int(port)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, help="host:port to listen on")
    p.add_argument("--backend", action="append", required=True, help="host:port of a replica (repeat)")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args()
    proxy = Proxy([hostport(b) for b in a.backend], a.verbose)
    host, port = hostport(a.listen)
    server = await asyncio.start_server(proxy.handle, host, port, limit=1 << 20)
    print(f"rr_proxy: listening on {host}:{port}, {len(a.backend)} backends", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
