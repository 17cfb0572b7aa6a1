#!/usr/bin/env python3
"""The release records agree: releases.toml (each release's version, commit and day), CHANGELOG.md (a section for
each, and one for what is unreleased), docs/UPGRADING.md (each release's notes), the workspace version (the newest
release's, or the next one's once it is bumped) and the chart's appVersion (the workspace version). With the git
history at hand, each release's commit exists and carries that version in its Cargo.toml. Exit 1 with one line per
disagreement.

    python3 tests/release-check.py
"""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def semver(v):
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", v)
    return tuple(int(x) for x in m.groups()) if m else None


def main():
    problems = []
    releases = tomllib.loads((ROOT / "releases.toml").read_text())["release"]
    seen = []
    for r in releases:
        v, commit, date = r.get("version", ""), r.get("commit", ""), r.get("date", "")
        if semver(v) is None:
            problems.append(f"releases.toml: version {v!r} is not MAJOR.MINOR.PATCH")
            continue
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            problems.append(f"releases.toml: {v}: commit {commit!r} is not 40 hex digits")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            problems.append(f"releases.toml: {v}: date {date!r} is not YYYY-MM-DD")
        if seen and semver(v) <= semver(seen[-1]):
            problems.append(f"releases.toml: {v} comes after {seen[-1]}: newest last, each newer than the one before")
        seen.append(v)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\S+))?$", changelog, re.M)
    if not sections or sections[0][0] != "Unreleased":
        problems.append("CHANGELOG.md: the first section is not ## [Unreleased]")
    dated = {name: date for name, date in sections if name != "Unreleased"}
    upgrading = (ROOT / "docs/UPGRADING.md").read_text()
    for r in releases:
        v = r.get("version")
        if dated.get(v) != r.get("date"):
            problems.append(f"CHANGELOG.md: no section ## [{v}] - {r.get('date')}")
        if f"### {v} ({r.get('date')})" not in upgrading:
            problems.append(f"docs/UPGRADING.md: no section ### {v} ({r.get('date')})")
    order = [semver(n) for n, _ in sections if n != "Unreleased" and semver(n)]
    if order != sorted(order, reverse=True):
        problems.append("CHANGELOG.md: the releases are not newest first")
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    if seen and semver(workspace) and semver(workspace) < semver(seen[-1]):
        problems.append(f"Cargo.toml: the workspace version {workspace} is behind the newest release {seen[-1]}")
    chart = (ROOT / "helm/mcpfleet/Chart.yaml").read_text()
    app = re.search(r'^appVersion:\s*"?([^"\s]+)"?', chart, re.M)
    if not app or app.group(1) != workspace:
        problems.append(f"helm/mcpfleet/Chart.yaml: appVersion is not the workspace version {workspace}")
    for r in releases:
        commit, v = r.get("commit", ""), r.get("version")
        shown = subprocess.run(["git", "show", f"{commit}:Cargo.toml"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode != 0:
            problems.append(f"releases.toml: {v}: commit {commit[:12]} is not in this clone (fetch it: git fetch --unshallow)")
            continue
        at = tomllib.loads(shown.stdout)["workspace"]["package"]["version"]
        if at != v:
            problems.append(f"releases.toml: {v}: commit {commit[:12]} carries version {at}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
