#!/usr/bin/env python3
"""The report of tests/cost.sh: each pair's figures, then the medians of the per-pair ratios against issue 32's
targets. Input: the runs' figures, one JSON object per line (mcpfleet-bench --json, plus `pair` and `pg_cpu_ms`).
With --realistic (SET=realistic), the rows are labelled "WORKLOAD: rmcp" and "WORKLOAD: 1 replica", and the report
is one table of CPU per op for each workload, rmcp's beside the replica's. With --ladder (SET=ladder), each setup's
replica CPU per call against rmcp's, and what each step up the ladder adds. With --policy (SET=policy), one replica
with a policy of three plans (and revocations in force) against the same replica on the flags alone.

    python3 tests/cost-report.py ROWS.jsonl
    python3 tests/cost-report.py --realistic ROWS.jsonl
    python3 tests/cost-report.py --ladder ROWS.jsonl
    python3 tests/cost-report.py --policy ROWS.jsonl
    python3 tests/cost-report.py --downstreams ROWS.jsonl
    python3 tests/cost-report.py --dpop ROWS.jsonl
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


# Why a workload has no rmcp counterpart (the realistic set).
RMCP_NA = {
    "resume": "rmcp 3.11's LocalSessionManager drops a request's stream, and its cached events, once the response "
              "is sent: a GET with Last-Event-ID after the end gets an empty stream",
}


def print_runs(rows):
    """Every run, one row each."""
    print("| pair | setup | calls/s | p50 ms | p99 ms | server CPU ms/call | Redis CPU ms/call | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        errors = ", ".join(f"{k}: {n}" for k, n in r["errors"].items()) or "none"
        print(f"| {r['pair']} | {r['label']} | {r['calls_per_sec']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{fmt(r['server_cpu_ms_per_call'])} | {fmt(r['redis_cpu_ms_per_call'])} | {errors} |")


def median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def realistic(path):
    """The realistic set: every run, then one row per workload (medians over the pairs)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    pairs = sorted({r["pair"] for r in rows})
    by = {(r["pair"], r["label"]): r for r in rows}
    workloads = list(dict.fromkeys(r["label"].split(": ")[0] for r in rows))
    print("| pair | setup | ops/s | p50 ms | p99 ms | requests/op | server CPU ms/op | Redis CPU ms/op | "
          "Redis cmds/op | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        errors = ", ".join(f"{k}: {n}" for k, n in r["errors"].items()) or "none"
        print(f"| {r['pair']} | {r['label']} | {r['calls_per_sec']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{fmt(r.get('requests_per_op'), 2)} | {fmt(r['server_cpu_ms_per_call'])} | "
              f"{fmt(r['redis_cpu_ms_per_call'])} | {fmt(r['redis_cmds_per_call'], 2)} | {errors} |")
    print()
    print(f"Medians over {len(pairs)} pairs (the ratios taken within each pair; CPU per op, one op = one iteration of "
          "the load generator's loop):")
    print()
    print("| workload | rmcp server CPU ms/op | replica CPU ms/op | Redis CPU ms/op | replica / rmcp | "
          "(replica + Redis) / rmcp | ops/s rmcp | ops/s replica | requests/op rmcp, replica | "
          "server CPU ms/request rmcp, replica | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for w in workloads:
        rm = [by.get((p, f"{w}: rmcp")) for p in pairs]
        re = [by.get((p, f"{w}: 1 replica")) for p in pairs]
        field = lambda runs, f: median_of([r[f] for r in runs if r])
        per_request = lambda runs: median_of([r["server_cpu_ms_per_call"] / r["requests_per_op"] for r in runs
                                              if r and r["server_cpu_ms_per_call"] and r.get("requests_per_op")])
        ratios, totals = [], []
        for a, b in zip(re, rm):
            if a and b and a["server_cpu_ms_per_call"] and b["server_cpu_ms_per_call"]:
                ratios.append(a["server_cpu_ms_per_call"] / b["server_cpu_ms_per_call"])
                totals.append((a["server_cpu_ms_per_call"] + (a["redis_cpu_ms_per_call"] or 0))
                              / b["server_cpu_ms_per_call"])
        errors = sum(sum(r["errors"].values()) for r in rm + re if r)
        ops = sum(r["calls"] for r in rm + re if r)
        has_rmcp = any(rm)
        na = "n/a" if not has_rmcp else None
        if not has_rmcp and w in RMCP_NA:
            notes.append(f"{w}: rmcp n/a: {RMCP_NA[w]}.")
        print(f"| {w} | {na or fmt(field(rm, 'server_cpu_ms_per_call'), 3)} | "
              f"{fmt(field(re, 'server_cpu_ms_per_call'), 3)} | {fmt(field(re, 'redis_cpu_ms_per_call'), 3)} | "
              f"{na or fmt(median_of(ratios), 2) + ' ×'} | {na or fmt(median_of(totals), 2) + ' ×'} | "
              f"{na or fmt(field(rm, 'calls_per_sec'), 0)} | {fmt(field(re, 'calls_per_sec'), 0)} | "
              f"{na or fmt(field(rm, 'requests_per_op'), 2)}, {fmt(field(re, 'requests_per_op'), 2)} | "
              f"{na or fmt(per_request(rm), 3)}, {fmt(per_request(re), 3)} | {errors} of {ops:.0f} |")
    for n in notes:
        print(f"\n{n}", end="")
    print()


def ladder(path):
    """SET=ladder: every run, then each setup (in the order of the rows) against rmcp, and each step's cost."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    pairs = sorted({r["pair"] for r in rows})
    by = {(r["pair"], r["label"]): r for r in rows}
    setups = [s for s in dict.fromkeys(r["label"] for r in rows if r["pair"] == pairs[0])]
    print_runs(rows)
    print()
    print(f"Medians over {len(pairs)} pairs (ratios and differences taken within each pair):")
    print()
    print("| setup | server CPU ms/call | / rmcp, per pair | / rmcp | step: ms/call added | step / rmcp |")
    print("|---|---|---|---|---|---|")
    cpu = lambda p, s: by[(p, s)]["server_cpu_ms_per_call"] if (p, s) in by else None
    for i, s in enumerate(setups):
        ratios = [cpu(p, s) / cpu(p, "rmcp") for p in pairs if cpu(p, s) and cpu(p, "rmcp")]
        step, step_ratio = "-", "-"
        if i > 1:
            prev = setups[i - 1]
            diffs = [cpu(p, s) - cpu(p, prev) for p in pairs if cpu(p, s) and cpu(p, prev)]
            steps = [(cpu(p, s) - cpu(p, prev)) / cpu(p, "rmcp") for p in pairs
                     if cpu(p, s) and cpu(p, prev) and cpu(p, "rmcp")]
            step, step_ratio = f"{fmt(median_of(diffs))}", f"{fmt(median_of(steps), 2)} ×"
        print(f"| {s} | {fmt(median_of([cpu(p, s) for p in pairs]))} | {' '.join(f'{v:.2f}' for v in ratios)} | "
              f"{fmt(median_of(ratios), 2)} × | {step} | {step_ratio} |")


def policy(path, pol="1 replica, 3-plan policy"):
    """SET=policy (and SET=downstreams, with its own setup as `pol`): every run, then that setup against the
    flags', within each pair: replica and Redis CPU."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    pairs = sorted({r["pair"] for r in rows})
    by = {(r["pair"], r["label"]): r for r in rows}
    print_runs(rows)
    print()
    flags = "1 replica, flags"
    print(f"Medians over {len(pairs)} pairs of the per-pair ratios, {pol} / {flags}:")
    print()
    print("| figure | per pair | median |")
    print("|---|---|---|")
    for name, field in (("replica CPU per call", "server_cpu_ms_per_call"), ("Redis CPU per call", "redis_cpu_ms_per_call")):
        ratios = [by[(p, pol)][field] / by[(p, flags)][field] for p in pairs
                  if (p, pol) in by and (p, flags) in by and by[(p, pol)][field] and by[(p, flags)][field]]
        print(f"| {name} | {' '.join(f'{v:.3f}' for v in ratios)} | {fmt(median_of(ratios), 3)} × |")


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
    if len(sys.argv) == 3 and sys.argv[1] == "--realistic":
        realistic(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--ladder":
        ladder(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--policy":
        policy(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--downstreams":
        policy(sys.argv[2], "1 replica, downstreams")
    elif len(sys.argv) == 3 and sys.argv[1] == "--dpop":
        policy(sys.argv[2], "1 replica, DPoP")
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
