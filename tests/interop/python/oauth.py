#!/usr/bin/env python3
"""Sign in to `mcpfleet serve --fixtures conformance --auth dev` with the official Python SDK's OAuth client.

    .tools/venv-mcp1/bin/python tests/interop/python/oauth.py --url http://127.0.0.1:8080/mcp
    .tools/venv-mcp2/bin/python tests/interop/python/oauth.py --url http://127.0.0.1:8080/mcp [--generation 2026]

Starts with no token. The SDK's own `OAuthClientProvider` (an httpx auth flow, with an in-memory token storage)
gets the 401, discovers the protected resource metadata and from it the authorization server (RFC 9728, then
RFC 8414), registers a client dynamically (RFC 7591), authorizes with PKCE and exchanges the code for a token.
The "browser" is the redirect handler: it fetches the authorization URL without following redirects (the dev
server approves at once) and reads `code`, `state` (and `iss`) from the `Location` header, which the callback
handler hands back to the SDK. Then it lists the tools and calls `test_whoami`, which needs the extra scope
`fixtures:whoami`: the server answers 403 `insufficient_scope` with `scope="mcp:access fixtures:whoami"`, and the
SDK must step up (authorize again with the wider scope, without registering again) and retry.

On success the last stdout line is one JSON object:
{"client":"python-mcp","version":"<x>","generation":"...","steps":[...],"sub":"...","scopes":[...]}; on a failure
it prints what failed to stderr and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from common import (MODERN_VERSION, SDK_MAJOR, SDK_VERSION, StepRunner, check, parse_args, run_reported,
                    sdk_lacks_generation, wire)
from mcp import types
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

if SDK_MAJOR >= 2:
    import httpx2 as httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import AuthorizationCodeResult
else:
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client  # 1.x's classic entry point (see workflow.py)

BASE_SCOPE = "mcp:access"
WHOAMI_SCOPE = "fixtures:whoami"


class InMemoryTokenStorage:
    """The SDK's `TokenStorage` protocol, kept in memory: this process starts with nothing."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.token_history: list[OAuthToken] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.token_history.append(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


@dataclass
class Browser:
    """Stands in for the user's browser: follows the authorization URL one hop and catches the redirect."""

    redirect_uri: str
    login_hint: str | None
    authorizations: list[dict[str, list[str]]] = field(default_factory=list)
    pending: dict[str, str | None] | None = None

    async def redirect_handler(self, authorization_url: str) -> None:
        url = urlparse(authorization_url)
        query = parse_qs(url.query)
        self.authorizations.append(query)
        if self.login_hint:
            # What the user would type on the sign-in page; the dev server takes it as the subject.
            url = url._replace(query=url.query + "&" + urlencode({"login_hint": self.login_hint}))
        async with httpx.AsyncClient(follow_redirects=False, timeout=10.0) as browser:
            r = await browser.get(urlunparse(url))
        check(r.status_code in (302, 303, 307), f"GET {authorization_url} answered HTTP {r.status_code}, not a "
                                                f"redirect: {r.text[:300]}")
        location = r.headers.get("location", "")
        check(location.startswith(self.redirect_uri), f"the authorization redirect goes to {location!r}, not to "
                                                      f"the registered redirect URI {self.redirect_uri}")
        back = {k: v[0] for k, v in parse_qs(urlparse(location).query).items()}
        check("error" not in back, f"the authorization server refused: {back}")
        check(bool(back.get("code")), f"the redirect carries no code: {location}")
        self.pending = {"code": back["code"], "state": back.get("state"), "iss": back.get("iss")}

    async def callback_handler(self) -> Any:
        check(self.pending is not None, "the callback handler ran before the redirect handler")
        got, self.pending = self.pending, None
        assert got is not None
        if SDK_MAJOR >= 2:
            return AuthorizationCodeResult(code=got["code"] or "", state=got["state"], iss=got["iss"])
        return got["code"] or "", got["state"]


@dataclass
class HttpLog:
    requests: list[tuple[str, str]] = field(default_factory=list)
    responses: list[tuple[str, str, int, dict[str, str]]] = field(default_factory=list)

    async def on_request(self, request: Any) -> None:
        self.requests.append((request.method, str(request.url)))

    async def on_response(self, response: Any) -> None:
        headers = {k.lower(): v for k, v in response.headers.items()}
        self.responses.append((response.request.method, str(response.request.url), response.status_code, headers))

    def to_path(self, path: str) -> list[tuple[str, int, dict[str, str]]]:
        return [(m, s, h) for m, u, s, h in self.responses if urlparse(u).path == path]


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OAuthRun(StepRunner):
    def __init__(self, url: str, generation: str, login_hint: str | None, timeout: float) -> None:
        super().__init__(url, generation, timeout)
        self.http = HttpLog()
        self.storage = InMemoryTokenStorage()
        # Nothing listens there: the browser stand-in reads the redirect instead of following it.
        self.redirect_uri = f"http://127.0.0.1:{free_loopback_port()}/callback"
        self.browser = Browser(self.redirect_uri, login_hint)
        self.whoami: dict[str, Any] = {}

    def provider(self) -> OAuthClientProvider:
        metadata = OAuthClientMetadata.model_validate(
            {
                "client_name": "mcpfleet-interop-python",
                "redirect_uris": [self.redirect_uri],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "none",
            }
        )
        return OAuthClientProvider(
            server_url=self.url,
            client_metadata=metadata,
            storage=self.storage,
            redirect_handler=self.browser.redirect_handler,
            callback_handler=self.browser.callback_handler,
        )

    @contextlib.asynccontextmanager
    async def connect(self) -> Any:
        hooks = {"request": [self.http.on_request], "response": [self.http.on_response]}
        info = types.Implementation(name="mcpfleet-interop-python-oauth", version=SDK_VERSION)
        if SDK_MAJOR >= 2:
            async with httpx.AsyncClient(auth=self.provider(), timeout=httpx.Timeout(30.0, read=60.0),
                                         event_hooks=hooks) as client:
                transport = streamable_http_client(self.url, http_client=client, terminate_on_close=True)
                mode = "legacy" if self.generation == "2025" else "auto"
                async with Client(transport, mode=mode, read_timeout_seconds=30.0, client_info=info) as c:
                    self.negotiated = c.protocol_version
                    yield c
            return
        import warnings
        from datetime import timedelta

        def factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
            return httpx.AsyncClient(headers=headers, timeout=timeout, auth=auth, event_hooks=hooks)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            transport = streamablehttp_client(self.url, timeout=30, sse_read_timeout=60, auth=self.provider(),
                                              httpx_client_factory=factory)
        async with transport as (read, write, _):
            async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=30), client_info=info) as s:
                self.negotiated = (await s.initialize()).protocolVersion
                yield s

    async def _run(self) -> None:
        modern = self.generation == "2026"
        self.current = "server/discover" if modern else "initialize"
        async with self.connect() as c:
            with self.step("oauth: 401 + discovery"):
                first = self.http.responses[0]
                check(first[2] == 401, f"the first request was answered HTTP {first[2]}, not 401: did the server "
                                       "start with --auth dev?")
                challenge = first[3].get("www-authenticate", "")
                check("resource_metadata=" in challenge, f"the 401 challenge has no resource_metadata: {challenge!r}")
                prm = self.http.to_path("/.well-known/oauth-protected-resource/mcp")
                check(any(s == 200 for _, s, _ in prm), f"the SDK did not read the PRM at "
                                                        f"/.well-known/oauth-protected-resource/mcp: {prm}")
                asm = self.http.to_path("/.well-known/oauth-authorization-server")
                check(any(s == 200 for _, s, _ in asm), f"the SDK did not read the RFC 8414 metadata: {asm}")
            with self.step("oauth: dynamic registration"):
                reg = self.http.to_path("/oauth/register")
                check([s for _, s, _ in reg] in ([201], [200]), f"registration answered {[s for _, s, _ in reg]}")
                check(self.storage.client_info is not None and bool(self.storage.client_info.client_id),
                      "no client id was stored")
            with self.step("oauth: authorize (PKCE) + token"):
                check(len(self.browser.authorizations) == 1, f"{len(self.browser.authorizations)} authorizations")
                q = self.browser.authorizations[0]
                check(q.get("code_challenge_method") == ["S256"] and bool(q.get("code_challenge")),
                      f"the authorization request has no S256 PKCE challenge: {q}")
                check(q.get("client_id") == [self.storage.client_info.client_id], "wrong client_id in authorize")
                check(self.storage.tokens is not None, "no token was stored")
                scopes = set((q.get("scope") or [""])[0].split())
                # mcp 2.x also asks for offline_access (a refresh token) when the server lists it (SEP-2207).
                check(scopes - {"offline_access"} == {BASE_SCOPE},
                      f"the first authorization asked for {scopes}, not {{{BASE_SCOPE}}}")
                tok = self.http.to_path("/oauth/token")
                check([s for _, s, _ in tok] == [200], f"the token endpoint answered {[s for _, s, _ in tok]}")
            if modern:
                with self.step("server/discover"):
                    check(self.negotiated == MODERN_VERSION, f"negotiated {self.negotiated!r}, not {MODERN_VERSION}")
            else:
                with self.step("initialize"):
                    check(self.negotiated in ("2025-03-26", "2025-06-18", "2025-11-25"),
                          f"negotiated {self.negotiated!r}")

            with self.step("tools/list"):
                names = [t.name for t in (await c.list_tools()).tools]
                check("test_simple_text" in names, f"tools/list lacks test_simple_text: {names}")
                self.whoami_listed_before = "test_whoami" in names

            with self.step("tools/call test_whoami (step-up)"):
                before = len(self.http.responses)
                r = wire(await c.call_tool("test_whoami", {}))
                check(not r.get("isError"), f"test_whoami failed: {r}")
                seen = self.http.responses[before:]
                forbidden = [h.get("www-authenticate", "") for m, _, s, h in seen if s == 403]
                check(len(forbidden) == 1, f"expected one 403 before the step-up, saw {len(forbidden)}")
                check('error="insufficient_scope"' in forbidden[0]
                      and f'scope="{BASE_SCOPE} {WHOAMI_SCOPE}"' in forbidden[0],
                      f"the 403 challenge is {forbidden[0]!r}")
                check(len(self.browser.authorizations) == 2,
                      f"the SDK authorized {len(self.browser.authorizations)} times, not twice (no step-up)")
                asked = set((self.browser.authorizations[1].get("scope") or [""])[0].split())
                check(asked >= {BASE_SCOPE, WHOAMI_SCOPE}, f"the step-up asked for {asked}")
                check(len(self.http.to_path("/oauth/register")) == 1, "the SDK registered again on the step-up")
                body = json.loads(r["content"][0]["text"])
                check(WHOAMI_SCOPE in body.get("scopes", []), f"whoami's scopes lack {WHOAMI_SCOPE}: {body}")
                check(body.get("client_id") == self.storage.client_info.client_id,
                      f"whoami's client_id {body.get('client_id')!r} is not the registered one")
                if self.browser.login_hint:
                    check(body.get("sub") == self.browser.login_hint, f"whoami's sub is {body.get('sub')!r}")
                self.whoami = body

            with self.step("tools/list (after step-up)"):
                # The server filters tools/list by the caller's scopes: test_whoami shows up only with its scope.
                listed = await (c.list_tools(cache_mode="refresh") if SDK_MAJOR >= 2 else c.list_tools())
                names = [t.name for t in listed.tools]
                check(not self.whoami_listed_before, "test_whoami was listed before the token had its scope")
                check("test_whoami" in names, "test_whoami is not listed even with the fixtures:whoami scope")
        if not modern:
            with self.step("DELETE"):
                deletes = [s for m, _, s, _ in self.http.responses if m == "DELETE"]
                check(deletes == [200] or deletes == [204], f"the session DELETE answered {deletes}")


def main() -> int:
    def login_hint(p: Any) -> None:
        p.add_argument("--login-hint", default="interop-python",
                       help="the subject to sign in as (sent as login_hint; empty for the server's default)")

    a = parse_args(__doc__, "the MCP endpoint of a server started with --auth dev", more=login_hint)
    if sdk_lacks_generation("oauth.py", a.generation):
        return 2
    run = OAuthRun(a.url, a.generation, a.login_hint or None, a.timeout)
    started = time.monotonic()

    def http_report() -> list[str]:
        return ["oauth.py: HTTP exchanges: " + ", ".join(f"{m} {urlparse(u).path} {s}"
                                                        for m, u, s, _ in run.http.responses[:40])]

    if not run_reported("oauth.py", run, a, http_report, describe_data=False):
        return 1
    print(f"oauth.py: ok in {time.monotonic() - started:.1f} s: sub={run.whoami.get('sub')} "
          f"scopes={run.whoami.get('scopes')}", file=sys.stderr)
    print(json.dumps({"client": "python-mcp", "version": SDK_VERSION, "generation": a.generation,
                      "steps": run.steps, "sub": run.whoami.get("sub"), "scopes": run.whoami.get("scopes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
