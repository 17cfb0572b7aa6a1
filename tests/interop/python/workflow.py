#!/usr/bin/env python3
"""A realistic MCP client workflow with the official Python SDK (`mcp` on PyPI), 1.x or 2.x.

    .tools/venv-mcp1/bin/python tests/interop/python/workflow.py --url http://127.0.0.1:8080/mcp
    .tools/venv-mcp2/bin/python tests/interop/python/workflow.py --url http://127.0.0.1:8080/mcp --generation 2026

Runs against `mcpfleet serve --fixtures conformance` (one replica, or a fleet behind a round-robin proxy).

--generation 2025 (default): the session generation. `initialize`, the four lists, a tool call, two resource
reads (static and templated), a prompt, a completion, a tool that asks for a sampling completion and one that
asks for an elicitation (answered by this client's callbacks: server->client requests on the call's SSE stream,
whose answer POST may land on another replica), progress notifications through a progress callback, resumption
(`test_reconnection` closes its SSE stream on purpose; the SDK must resume with a GET carrying Last-Event-ID and
still get the result), 100 `tools/call`s, and the session DELETE when the client closes.

--generation 2026 (mcp 2.x only): the stateless 2026-07-28 revision. `server/discover` instead of `initialize`;
sampling and elicitation arrive as multi round-trip `input_required` results that the SDK answers through the
same callbacks and retries (the retry may land on any replica). That revision has no resumable streams and no
session, so there is no resumption step and no DELETE; the script checks instead that no request carried a
session id and that nothing but POSTs was sent.

Every step asserts its result. On a failure it prints what failed to stderr and exits 1 (2 for a usage error).
On success the last stdout line is one JSON object:
{"client":"python-mcp","version":"<x>","generation":"2025|2026","steps":[...]}; for 2026 it also carries
"skipped", each step this generation cannot have, with the reason.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from common import (MODERN_VERSION, SDK_MAJOR, SDK_VERSION, StepFailed, StepRunner, check, describe, parse_args,
                    run_reported, sdk_lacks_generation, wire)
from mcp import types

if SDK_MAJOR >= 2:
    import httpx2 as httpx  # mcp 2.x is built on httpx2 (a separate package), not httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
else:
    import httpx
    from mcp import ClientSession
    # 1.x's classic entry point. mcp 1.30 marks it deprecated in favour of `streamable_http_client` (which takes
    # an httpx.AsyncClient); it builds its client with `httpx_client_factory(headers, timeout, auth)` and then
    # calls that. It is what 1.x code in the wild uses, so it is what this workflow uses.
    from mcp.client.streamable_http import streamablehttp_client

SESSION_VERSIONS = {"2025-03-26", "2025-06-18", "2025-11-25"}
LOOP_CALLS = 100
SAMPLED_TEXT = "pong from the python interop client"
ELICITED = {"username": "interop-user", "email": "interop@example.com"}


def texts(result: dict[str, Any]) -> list[str]:
    return [c.get("text", "") for c in result.get("content", []) if c.get("type") == "text"]


@dataclass
class HttpLog:
    """Every HTTP exchange the SDK made, seen through the httpx client's event hooks."""

    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    responses: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)  # the JSON-RPC message of every POST, in order

    async def on_request(self, request: Any) -> None:
        self.requests.append((request.method, {k.lower(): v for k, v in request.headers.items()}))
        if request.method == "POST":
            try:
                self.bodies.append(json.loads(request.content))
            except Exception:  # noqa: BLE001 - a body we cannot read is simply not recorded
                self.bodies.append(None)

    def calls_of(self, tool: str, since: int = 0) -> list[dict[str, Any]]:
        """The tools/call requests of `tool` posted since body number `since`."""
        return [b for b in self.bodies[since:] if isinstance(b, dict) and b.get("method") == "tools/call"
                and (b.get("params") or {}).get("name") == tool]

    def answers(self, since: int = 0) -> list[dict[str, Any]]:
        """The JSON-RPC responses this client posted (answers to server->client requests) since `since`."""
        return [b for b in self.bodies[since:] if isinstance(b, dict) and "method" not in b
                and ("result" in b or "error" in b)]

    async def on_response(self, response: Any) -> None:
        headers = {k.lower(): v for k, v in response.headers.items()}
        self.responses.append((response.request.method, response.status_code, headers))

    def statuses(self, method: str) -> list[int]:
        return [s for m, s, _ in self.responses if m == method]

    def resuming_gets(self) -> list[str]:
        return [h["last-event-id"] for m, h in self.requests if m == "GET" and "last-event-id" in h]

    def errors(self) -> list[tuple[str, int]]:
        return [(m, s) for m, s, _ in self.responses if s >= 400]


@dataclass
class Callbacks:
    sampled: list[dict[str, Any]] = field(default_factory=list)
    elicited: list[dict[str, Any]] = field(default_factory=list)
    progress: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    async def sampling(self, context: Any, params: Any) -> Any:
        self.sampled.append(wire(params))
        return types.CreateMessageResult.model_validate(
            {
                "role": "assistant",
                "content": {"type": "text", "text": SAMPLED_TEXT},
                "model": "interop-model",
                "stopReason": "endTurn",
            }
        )

    async def elicitation(self, context: Any, params: Any) -> Any:
        self.elicited.append(wire(params))
        return types.ElicitResult.model_validate({"action": "accept", "content": dict(ELICITED)})

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((progress, total, message))


class Session:
    """The few calls the workflow makes, over either SDK major, answering with wire-form dicts."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl

    async def list_tools(self) -> dict[str, Any]:
        return wire(await self.impl.list_tools())

    async def list_resources(self) -> dict[str, Any]:
        return wire(await self.impl.list_resources())

    async def list_resource_templates(self) -> dict[str, Any]:
        return wire(await self.impl.list_resource_templates())

    async def list_prompts(self) -> dict[str, Any]:
        return wire(await self.impl.list_prompts())

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, progress: Any = None) -> dict[str, Any]:
        return wire(await self.impl.call_tool(name, arguments or {}, progress_callback=progress))

    async def read_resource(self, uri: str) -> dict[str, Any]:
        if SDK_MAJOR >= 2:
            return wire(await self.impl.read_resource(uri))
        from pydantic import AnyUrl

        return wire(await self.impl.read_resource(AnyUrl(uri)))

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> dict[str, Any]:
        return wire(await self.impl.get_prompt(name, arguments))

    async def complete(self, prompt: str, argument: str, value: str) -> dict[str, Any]:
        ref = types.PromptReference(type="ref/prompt", name=prompt)
        return wire(await self.impl.complete(ref, {"name": argument, "value": value}))


class Workflow(StepRunner):
    between_steps = "(between steps)"

    def __init__(self, url: str, generation: str, timeout: float) -> None:
        super().__init__(url, generation, timeout)
        self.skipped: dict[str, str] = {}
        self.http = HttpLog()
        self.cb = Callbacks()
        self.connect_info: dict[str, Any] = {}

    def http_client(self) -> Any:
        return httpx.AsyncClient(
            timeout=httpx.Timeout(30.0, read=60.0),
            event_hooks={"request": [self.http.on_request], "response": [self.http.on_response]},
        )

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Session]:
        """Connect (initialize or discover) and yield a Session; closing it sends the DELETE (2025)."""
        if SDK_MAJOR < 2:
            async with self._connect_v1() as session:
                yield session
            return
        async with self.http_client() as client:
            transport = streamable_http_client(self.url, http_client=client, terminate_on_close=True)
            # "legacy" is the initialize handshake; "auto" probes server/discover at 2026-07-28 and adopts it
            # (falling back to initialize only if the server is not modern, which the discover step then flags).
            mode = "legacy" if self.generation == "2025" else "auto"
            async with Client(
                transport,
                mode=mode,
                sampling_callback=self.cb.sampling,
                elicitation_callback=self.cb.elicitation,
                read_timeout_seconds=30.0,
                client_info=types.Implementation(name="mcpfleet-interop-python", version=SDK_VERSION),
            ) as c:
                if c.session.initialize_result is not None:
                    self.connect_info = wire(c.session.initialize_result)
                elif c.session.discover_result is not None:
                    self.connect_info = wire(c.session.discover_result)
                self.connect_info["_negotiated"] = c.protocol_version
                self.connect_info["_server_info"] = wire(c.server_info) if c.server_info else None
                yield Session(c)

    @contextlib.asynccontextmanager
    async def _connect_v1(self) -> AsyncIterator[Session]:
        import warnings
        from datetime import timedelta

        def factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
            client = self.http_client()
            if headers:
                client.headers.update(headers)
            if timeout is not None:
                client.timeout = timeout
            if auth is not None:
                client.auth = auth
            return client

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            transport = streamablehttp_client(self.url, timeout=30, sse_read_timeout=60, terminate_on_close=True,
                                              httpx_client_factory=factory)
        async with transport as (read, write, get_session_id):
            async with ClientSession(
                read,
                write,
                read_timeout_seconds=timedelta(seconds=30),
                sampling_callback=self.cb.sampling,
                elicitation_callback=self.cb.elicitation,
                client_info=types.Implementation(name="mcpfleet-interop-python", version=SDK_VERSION),
            ) as s:
                init = wire(await s.initialize())
                self.connect_info = init
                self.connect_info["_negotiated"] = init.get("protocolVersion")
                self.connect_info["_server_info"] = init.get("serverInfo")
                self.connect_info["_session_id"] = get_session_id()
                yield Session(s)

    async def _run(self) -> None:
        modern = self.generation == "2026"
        self.current = "server/discover" if modern else "initialize"
        async with self.connect() as s:
            info = self.connect_info
            if modern:
                with self.step("server/discover"):
                    check(info.get("_negotiated") == MODERN_VERSION,
                          f"the SDK did not adopt {MODERN_VERSION} after server/discover (it negotiated "
                          f"{info.get('_negotiated')!r}: the probe failed and it fell back to initialize)")
                    check(MODERN_VERSION in info.get("supportedVersions", []),
                          f"discover result lacks {MODERN_VERSION} in supportedVersions: {info}")
                    self._check_capabilities(info.get("capabilities", {}))
            else:
                with self.step("initialize"):
                    check(info.get("_negotiated") in SESSION_VERSIONS,
                          f"negotiated protocol version {info.get('_negotiated')!r} is not a session version")
                    self._check_capabilities(info.get("capabilities", {}))
                    check(info.get("instructions") == "mcpfleet conformance fixtures",
                          f"unexpected instructions {info.get('instructions')!r}")
                    session_ids = {h.get("mcp-session-id") for m, _, h in self.http.responses if m == "POST"} - {None}
                    check(len(session_ids) == 1, f"initialize answered Mcp-Session-Id {session_ids}, not one id")
            check(bool((info.get("_server_info") or {}).get("name")), "the server did not identify itself")

            with self.step("tools/list"):
                tools = {t["name"]: t for t in (await s.list_tools())["tools"]}
                for name in ("test_simple_text", "test_tool_with_progress", "test_sampling", "test_elicitation",
                             "test_reconnection", "test_countdown"):
                    check(name in tools, f"tools/list lacks {name} (has {sorted(tools)})")
                check(tools["test_sampling"]["inputSchema"].get("required") == ["prompt"],
                      f"test_sampling's inputSchema is not as expected: {tools['test_sampling']['inputSchema']}")

            with self.step("resources/list"):
                uris = [r["uri"] for r in (await s.list_resources())["resources"]]
                check("test://static-text" in uris, f"resources/list lacks test://static-text: {uris}")

            with self.step("resources/templates/list"):
                templates = [t["uriTemplate"] for t in (await s.list_resource_templates())["resourceTemplates"]]
                check("test://template/{id}/data" in templates, f"templates lack test://template/{{id}}/data: {templates}")

            with self.step("prompts/list"):
                prompts = {p["name"]: p for p in (await s.list_prompts())["prompts"]}
                check({"test_simple_prompt", "test_prompt_with_arguments"} <= set(prompts),
                      f"prompts/list lacks the fixtures' prompts: {sorted(prompts)}")
                check([a["name"] for a in prompts["test_prompt_with_arguments"].get("arguments", [])] == ["arg1", "arg2"],
                      "test_prompt_with_arguments does not declare arg1 and arg2")

            with self.step("tools/call"):
                r = await s.call_tool("test_simple_text")
                check(not r.get("isError"), f"test_simple_text failed: {r}")
                check(texts(r) == ["This is a simple text response for testing."], f"test_simple_text said {r}")

            with self.step("resources/read"):
                r = await s.read_resource("test://static-text")
                c = r["contents"]
                check(len(c) == 1 and c[0].get("text") == "This is the content of the static text resource.",
                      f"test://static-text read as {r}")
                r = await s.read_resource("test://template/interop-42/data")
                c = r["contents"]
                check(len(c) == 1 and c[0].get("mimeType") == "application/json", f"the template read as {r}")
                body = json.loads(c[0]["text"])
                check(body == {"id": "interop-42", "templateTest": True, "data": "Data for ID: interop-42"},
                      f"the templated resource's body is {body}")

            with self.step("prompts/get"):
                r = await s.get_prompt("test_prompt_with_arguments", {"arg1": "alpha", "arg2": "beta"})
                msgs = r["messages"]
                check(len(msgs) == 1 and msgs[0]["role"] == "user", f"prompts/get answered {r}")
                check(msgs[0]["content"].get("text") == "Prompt with arguments: arg1='alpha', arg2='beta'",
                      f"prompts/get text is {msgs[0]['content']}")

            with self.step("completion/complete"):
                r = await s.complete("test_prompt_with_arguments", "arg1", "par")
                values = r["completion"]["values"]
                check(values == ["paris", "park", "party"], f"completion of arg1='par' gave {values}")

            with self.step("sampling"):
                mark = len(self.http.bodies)
                r = await s.call_tool("test_sampling", {"prompt": "ping from mcpfleet"})
                self._check_round_trip("test_sampling", mark, "sampling")
                check(len(self.cb.sampled) == 1, f"the sampling callback ran {len(self.cb.sampled)} times, not once")
                msg = self.cb.sampled[0]["messages"][0]["content"]
                check(msg.get("text") == "ping from mcpfleet", f"the sampling request carried {msg}")
                check(not r.get("isError"), f"test_sampling failed: {r}")
                check(texts(r) == [f"LLM response: {SAMPLED_TEXT}"], f"test_sampling said {r}")

            with self.step("elicitation"):
                mark = len(self.http.bodies)
                r = await s.call_tool("test_elicitation", {"message": "Who are you?"})
                self._check_round_trip("test_elicitation", mark, "elicitation")
                check(len(self.cb.elicited) == 1, f"the elicitation callback ran {len(self.cb.elicited)} times")
                check(self.cb.elicited[0].get("message") == "Who are you?",
                      f"the elicitation request carried {self.cb.elicited[0]}")
                check(not r.get("isError"), f"test_elicitation failed: {r}")
                said = texts(r)
                check(len(said) == 1 and said[0].startswith('User response: action="accept"')
                      and '"username":"interop-user"' in said[0] and '"email":"interop@example.com"' in said[0],
                      f"test_elicitation said {said}")

            with self.step("progress"):
                r = await s.call_tool("test_tool_with_progress", progress=self.cb.on_progress)
                check(texts(r) == ["Progress test completed"], f"test_tool_with_progress said {r}")
                got = [(p, t) for p, t, _ in self.cb.progress]
                check(got == [(0.0, 100.0), (50.0, 100.0), (100.0, 100.0)], f"progress callback got {self.cb.progress}")
                check([m for _, _, m in self.cb.progress] == [f"Completed step {i}" for i in (1, 2, 3)],
                      f"progress messages were {self.cb.progress}")

            if modern:
                self.skipped["resumption"] = (
                    "2026-07-28 has no resumable streams (no Last-Event-ID, no GET); a broken stream is re-issued")
            else:
                with self.step("resumption"):
                    before = len(self.http.resuming_gets())
                    started = time.monotonic()
                    r = await s.call_tool("test_reconnection")
                    check(not r.get("isError"), f"test_reconnection failed: {r}")
                    check(any("client properly reconnected" in t for t in texts(r)), f"test_reconnection said {r}")
                    gets = self.http.resuming_gets()[before:]
                    check(len(gets) >= 1, "the SDK got the result without a GET carrying Last-Event-ID: "
                                          "the stream was not closed, so resumption was not exercised")
                    check(time.monotonic() - started < 10, "resumption took over 10 s")

            with self.step(f"tools/call x{LOOP_CALLS}"):
                started = time.monotonic()
                for i in range(LOOP_CALLS):
                    try:
                        r = await s.call_tool("test_simple_text")
                    except Exception as exc:
                        raise StepFailed(f"call {i + 1} of {LOOP_CALLS}: {describe(exc)}") from exc
                    check(not r.get("isError") and texts(r) == ["This is a simple text response for testing."],
                          f"call {i + 1} of {LOOP_CALLS} answered {r}")
                self.loop_seconds = time.monotonic() - started

            if modern:
                self.skipped["DELETE"] = "2026-07-28 has no session to terminate"
            self.current = "DELETE" if not modern else "close"
        # Leaving the transport's context sent the DELETE (2025), through the SDK's own terminate_session().
        if modern:
            with self.step("stateless"):
                sids = [h["mcp-session-id"] for _, h in self.http.requests if "mcp-session-id" in h]
                check(not sids, f"a 2026-07-28 request carried Mcp-Session-Id: {sids[:3]}")
                others = sorted({m for m, _ in self.http.requests} - {"POST"})
                check(not others, f"the 2026-07-28 client sent {others} requests; that revision is POST only")
                versions = {h.get("mcp-protocol-version") for m, h in self.http.requests}
                check(versions == {MODERN_VERSION}, f"requests carried MCP-Protocol-Version {versions}")
        else:
            with self.step("DELETE"):
                deletes = self.http.statuses("DELETE")
                check(len(deletes) == 1, f"the SDK sent {len(deletes)} DELETE requests on close, not 1")
                check(deletes[0] in (200, 202, 204), f"the session DELETE answered HTTP {deletes[0]}")
        errors = self.http.errors()
        check(not errors, f"some HTTP responses were errors: {errors[:10]}")

    def _check_round_trip(self, tool: str, mark: int, kind: str) -> None:
        """How the client's answer reached the server: a JSON-RPC response POST in 2025 (a server->client request
        on the call's stream), a retry of the call with inputResponses and requestState in 2026-07-28."""
        calls = self.http.calls_of(tool, mark)
        if self.generation == "2026":
            check(len(calls) == 2, f"{tool} was posted {len(calls)} times, not twice (input_required, then retry)")
            retry = calls[1]["params"]
            check(bool(retry.get("requestState")), f"the retry of {tool} carries no requestState")
            answers = retry.get("inputResponses") or {}
            check(len(answers) == 1, f"the retry of {tool} carries inputResponses {answers}")
            check(not self.http.answers(mark), "a 2026-07-28 client posted a JSON-RPC response")
        else:
            check(len(calls) == 1, f"{tool} was posted {len(calls)} times, not once")
            answers = self.http.answers(mark)
            check(len(answers) == 1 and "result" in answers[0],
                  f"expected one answer POST to the server's {kind} request, saw {answers}")

    @staticmethod
    def _check_capabilities(caps: dict[str, Any]) -> None:
        for cap in ("tools", "resources", "prompts", "completions"):
            check(cap in caps, f"the server does not advertise {cap}: {caps}")


def main() -> int:
    a = parse_args(__doc__, "the MCP endpoint, e.g. http://127.0.0.1:8080/mcp",
                   timeout_help="seconds for the whole workflow (default 55)")
    if sdk_lacks_generation("workflow.py", a.generation, " (it has no server/discover)"):
        return 2

    wf = Workflow(a.url, a.generation, a.timeout)
    started = time.monotonic()

    def http_report() -> list[str]:
        errors = wf.http.errors()
        return [f"workflow.py: HTTP error responses seen: {errors[:10]}"] if errors else []

    if not run_reported("workflow.py", wf, a, http_report):
        return 1
    out: dict[str, Any] = {"client": "python-mcp", "version": SDK_VERSION, "generation": a.generation,
                           "steps": wf.steps}
    if wf.skipped:
        out["skipped"] = wf.skipped
    print(f"workflow.py: ok in {time.monotonic() - started:.1f} s, {len(wf.http.requests)} HTTP requests "
          f"({LOOP_CALLS} calls in {getattr(wf, 'loop_seconds', 0):.1f} s)", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
