"""What workflow.py and oauth.py share: the SDK's version, step checks, the wire form of results, and the run
harness (the command line, the step runner, the failure report).

The scripts run as `python tests/interop/python/<script>.py`, so Python puts this directory first on sys.path
and `import common` finds this file.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import version as dist_version
from typing import Any

import anyio

SDK_VERSION = dist_version("mcp")
SDK_MAJOR = int(SDK_VERSION.split(".")[0])
MODERN_VERSION = "2026-07-28"


class StepFailed(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise StepFailed(what)


def wire(model: Any) -> Any:
    """A result model as its JSON wire form (camelCase), whichever SDK major made it."""
    if isinstance(model, list):
        return [wire(m) for m in model]
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def describe(exc: BaseException, *, data: bool = True) -> str:
    """One readable line per leaf exception, through anyio's exception groups; with `data`, a JSON-RPC error's data
    too."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e, data=data) for e in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return "timed out"
    error = getattr(exc, "error", None)  # McpError / MCPError carry the JSON-RPC ErrorData
    if error is not None and hasattr(error, "code"):
        line = f"{type(exc).__name__}: JSON-RPC error {error.code}: {error.message}"
        extra = getattr(error, "data", None) if data else None
        return line + (f" (data: {extra})" if extra else "")
    return f"{type(exc).__name__}: {exc}"


class StepRunner:
    """A run of named steps against one URL in one generation, bounded by `timeout` seconds. `current` names the
    step under way (what a failure reports); `steps` lists those that passed. Subclasses write `_run`."""

    # What `current` says once a step has passed; None keeps the name of the step that passed last.
    between_steps: str | None = None

    def __init__(self, url: str, generation: str, timeout: float) -> None:
        self.url = url
        self.generation = generation
        self.timeout = timeout
        self.steps: list[str] = []
        self.current = "connect"

    @contextlib.contextmanager
    def step(self, name: str) -> Any:
        self.current = name
        yield
        self.steps.append(name)
        if self.between_steps is not None:
            self.current = self.between_steps

    async def run(self) -> None:
        with anyio.fail_after(self.timeout):
            await self._run()

    async def _run(self) -> None:
        raise NotImplementedError


def parse_args(doc: str | None, url_help: str, timeout_help: str | None = None,
               more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """`--url URL [--generation 2025|2026]`, what `more` adds, `[--timeout S] [--verbose]`; `--verbose` turns on
    the SDK's INFO log."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help=url_help)
    p.add_argument("--generation", choices=["2025", "2026"], default="2025")
    if more is not None:
        more(p)
    p.add_argument("--timeout", type=float, default=55.0, help=timeout_help)
    p.add_argument("--verbose", action="store_true", help="log the SDK's INFO messages; a traceback on failure")
    a = p.parse_args()
    if a.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
    return a


def sdk_lacks_generation(script: str, generation: str, why: str = "") -> bool:
    """Whether `generation` is 2026 and the SDK is 1.x, which cannot speak it; if so, says so on stderr."""
    if generation == "2026" and SDK_MAJOR < 2:
        print(f"{script}: mcp {SDK_VERSION} cannot speak 2026-07-28{why}; use mcp 2.x", file=sys.stderr)
        return True
    return False


def run_reported(script: str, runner: StepRunner, a: argparse.Namespace, http_report: Callable[[], list[str]],
                 describe_data: bool = True) -> bool:
    """Runs `runner`; on a failure prints where and why to stderr, then the lines of `http_report()` and, with
    --verbose, the traceback, and answers False."""
    try:
        anyio.run(runner.run)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported the same way
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"{script}: FAILED at step {runner.current!r} (mcp {SDK_VERSION}, generation {a.generation}, "
              f"{a.url}): {describe(exc, data=describe_data)}", file=sys.stderr)
        print(f"{script}: steps passed: {runner.steps}", file=sys.stderr)
        for line in http_report():
            print(line, file=sys.stderr)
        if a.verbose:
            traceback.print_exception(exc)
        return False
    return True
