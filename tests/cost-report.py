#!/usr/bin/env python3
"""The report of tests/cost.sh: each pair's figures, then the medians of the per-pair ratios against issue 32's
targets. Input: the runs' figures, one JSON object per line (mcpfleet-bench --json, plus `pair` and `pg_cpu_ms`).

    python3 tests/cost-report.py ROWS.jsonl
"""
import json
import statistics
import sys

TARGETS = [
    # (name, numerator setup, denominator setup or None for an absolute figure, field, bound, unit)
    ("1. replica CPU / rmcp server CPU", "1 replica", "rmcp", "server_cpu_ms_per_call", 0.8, "x"),
    ("1. replica CPU with the audit trail / rmcp server CPU", "1 + audit", "rmcp", "server_cpu_ms_per_call", 1.0, "x"),
    ("2. Redis CPU per call, 1 replica", "1 replica", None, "redis_cpu_ms_per_call", 0.010, "ms"),
    ("2. Redis CPU per call, 3 replicas", "3 replicas", None, "redis_cpu_ms_per_call", 0.010, "ms"),
    ("3. 3 replicas' CPU / 1 replica's, per call", "3 replicas", "1 replica", "server_cpu_ms_per_call", 1.2, "x"),
    ("3. the same, each of the 3 with 1 worker thread", "3 replicas, 1 worker each", "1 replica",
     "server_cpu_ms_per_call", 1.2, "x"),
]
# With BASE_BIN: the tree against the base binary, within each pair (reported, not targeted).
CHANGES = [
    ("1 replica: replica CPU, this tree / base", "1 replica", "1 replica [base]", "server_cpu_ms_per_call"),
    ("1 replica: Redis CPU, this tree / base", "1 replica", "1 replica [base]", "redis_cpu_ms_per_call"),
    ("3 replicas: replica CPU, this tree / base", "3 replicas", "3 replicas [base]", "server_cpu_ms_per_call"),
    ("3 replicas: Redis CPU, this tree / base", "3 replicas", "3 replicas [base]", "redis_cpu_ms_per_call"),
]


def fmt(v, digits=4):
    return "-" if v is None else f"{v:.{digits}f}"


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    pairs = sorted({r["pair"] for r in rows})
    by = {(r["pair"], r["label"]): r for r in rows}
    print("| pair | setup | calls/s | p50 ms | p99 ms | server CPU ms/call | Redis CPU ms/call | Redis cmds/call | "
          "PostgreSQL CPU ms/call | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pg = r["pg_cpu_ms"] / r["calls"] if r["label"] == "1 + audit" and r["calls"] else None
        errors = ", ".join(f"{k}: {n}" for k, n in r["errors"].items()) or "none"
        print(f"| {r['pair']} | {r['label']} | {r['calls_per_sec']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{fmt(r['server_cpu_ms_per_call'])} | {fmt(r['redis_cpu_ms_per_call'])} | "
              f"{fmt(r['redis_cmds_per_call'], 2)} | {fmt(pg)} | {errors} |")
    print()
    print(f"Medians over {len(pairs)} pairs (each ratio taken within its pair):")
    print()
    print("| target | per pair | median | bound | met |")
    print("|---|---|---|---|---|")
    missed = 0
    for name, num, den, field, bound, unit in TARGETS:
        values = []
        for p in pairs:
            a, b = by.get((p, num)), by.get((p, den)) if den else None
            if a is None or a[field] is None or (den and (b is None or not b[field])):
                continue
            values.append(a[field] / b[field] if den else a[field])
        if not values:
            print(f"| {name} | - | - | {bound} {unit} | not measured |")
            missed += 1
            continue
        med = statistics.median(values)
        met = med <= bound
        missed += not met
        digits = 2 if unit == "x" else 4
        shown = " ".join(fmt(v, digits) for v in values)
        print(f"| {name} | {shown} | {fmt(med, digits)} {unit} | {bound} {unit} | {'yes' if met else 'no'} |")
    changes = [c for c in CHANGES if any((p, c[2]) in by for p in pairs)]
    if changes:
        print()
        print("| change | per pair | median |")
        print("|---|---|---|")
    for name, num, den, field in changes:
        values = [by[(p, num)][field] / by[(p, den)][field] for p in pairs
                  if (p, num) in by and (p, den) in by and by[(p, num)][field] and by[(p, den)][field]]
        if values:
            print(f"| {name} | {' '.join(f'{v:.3f}' for v in values)} | {statistics.median(values):.3f} |")
    for setup in sorted({r["label"] for r in rows}):
        cps = [by[(p, setup)]["calls_per_sec"] for p in pairs if (p, setup) in by]
        if cps:
            print(f"\n{setup}: median {statistics.median(cps):.0f} calls/s (reported, not targeted)", end="")
    print()
    return missed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
