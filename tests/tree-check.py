#!/usr/bin/env python3
"""The tree's shape, checked: no import circle among the files of any crate (nor among its top-level modules), and no
source file over 800 lines outside tests. Run by tests/run-all.sh; exits 1 with one line per offence.

An edge is a `use crate::…`, `use super::…`, `use self::…` or a `crate::…`/`super::…` path in a file's code (its
`#[cfg(test)] mod tests` left out), resolved to the deepest file it names."""
import collections
import os
import re
import sys

MAX_LINES = 800
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split("/")
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def split_top(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out if x.strip()]


def expand(prefix, rest):
    m = re.match(r"((?:\w+::)*)\{(.*)\}$", rest, re.S)
    if m:
        pre = [p for p in m.group(1).split("::") if p]
        return [q for item in split_top(m.group(2)) for q in expand(prefix + pre, item)]
    return [prefix + [p for p in rest.split(" as ")[0].strip().split("::") if p]]


def strongly_connected(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def check_crate(crate_dir):
    src = os.path.join(crate_dir, "src")
    files = {}
    for d, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                files[module_of(src, os.path.join(d, n))] = os.path.join(d, n)
    offences = []
    edges = collections.defaultdict(set)
    for module, path in files.items():
        text = open(path, encoding="utf-8").read()
        lines = text.count("\n")
        code = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
        code = re.sub(r"//.*", "", code)
        if code.count("\n") > MAX_LINES:
            offences.append(f"{os.path.relpath(path, ROOT)}: {lines} lines (at most {MAX_LINES} outside tests)")
        dir_module = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
        paths = []
        for m in re.finditer(r"\buse\s+(crate|super|self)::([^;]*);", code, re.S):
            paths += [(m.group(1), p) for p in expand([], m.group(2).strip())]
        for m in re.finditer(r"\b(crate|super)((?:::\w+)+)", code):
            paths.append((m.group(1), m.group(2).strip(":").split("::")))
        # A module's own children, named without `self::` (`worker::start`, `use worker::start`).
        for child in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code, re.M):
            if re.search(rf"(?<![\w:]){child}::", code):
                paths.append(("self", [child]))
        for kind, parts in paths:
            base = [] if kind == "crate" else list(module) if kind == "self" else list(module)[:-1]
            if kind == "super" and dir_module:
                base = list(module)[:-1]
            target = base
            for p in parts:
                if tuple(target + [p]) in files:
                    target = target + [p]
                else:
                    break
            target = tuple(target)
            if target and target != module and target in files:
                edges[module].add(target)
    name = os.path.basename(crate_dir)
    for comp in strongly_connected(files, edges):
        offences.append(f"crates/{name}: an import circle among files: {', '.join('::'.join(c) for c in comp)}")
    top = collections.defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            if a[:1] != b[:1] and a and b:
                top[a[:1]].add(b[:1])
    tops = {m[:1] for m in files if m}
    for comp in strongly_connected(tops, top):
        offences.append(f"crates/{name}: an import circle among modules: {', '.join('::'.join(c) for c in comp)}")
    return offences


def main():
    crates = os.path.join(ROOT, "crates")
    dirs = [os.path.join(crates, c) for c in sorted(os.listdir(crates))]
    examples = os.path.join(ROOT, "examples")
    if os.path.isdir(examples):
        dirs += [os.path.join(examples, c) for c in sorted(os.listdir(examples))]
    offences = [o for d in dirs if os.path.isdir(os.path.join(d, "src")) for o in check_crate(d)]
    for o in offences:
        print(o)
    if offences:
        sys.exit(1)
    print(f"tree-check: {len(dirs)} crates, no import circle, no source file over {MAX_LINES} lines")


if __name__ == "__main__":
    main()
