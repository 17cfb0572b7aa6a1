#!/usr/bin/env python3
"""The report of tests/growth.sh: a Markdown table on stdout, and OUT/growth.csv and OUT/growth.svg (the curves).

    python3 tests/growth-report.py ROWS.jsonl OUT_DIR

ROWS holds, per point, the load generator's population row (`"phase": "population"`, absent when the point has
no population) and its load row, each tagged with `kind` (sessions | streams) and `n`. No plotting library: the
SVG is written by hand, so that the report runs wherever Python 3 does.
"""
import csv
import json
import sys
from pathlib import Path


def load(path):
    points = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        p = points.setdefault((r["kind"], r["n"]), {"kind": r["kind"], "n": r["n"]})
        if r.get("phase") == "population":
            p["pop"] = r
        else:
            p["load"] = r
    order = {"sessions": 0, "streams": 1}
    return [points[k] for k in sorted(points, key=lambda k: (order.get(k[0], 2), k[1]))]


COLUMNS = [
    ("kind", lambda p: p["kind"]),
    ("n", lambda p: p["n"]),
    ("calls/s", lambda p: p["load"].get("calls_per_sec")),
    ("replica CPU ms/call", lambda p: p["load"].get("server_cpu_ms_per_call")),
    ("Redis CPU ms/call", lambda p: p["load"].get("redis_cpu_ms_per_call")),
    ("replica CPU ms/call, net", lambda p: p.get("net", {}).get("replica_call")),
    ("Redis CPU ms/call, net", lambda p: p.get("net", {}).get("redis_call")),
    ("p50 ms", lambda p: p["load"].get("p50_ms")),
    ("p99 ms", lambda p: p["load"].get("p99_ms")),
    ("Redis used_memory MB", lambda p: p.get("pop", {}).get("redis_used_memory", 0) / 1e6 if p.get("pop") else None),
    ("Redis bytes/session", lambda p: p.get("pop", {}).get("redis_bytes_per_session")),
    ("replica RSS bytes/session", lambda p: p.get("pop", {}).get("replica_rss_bytes_per_session")),
    ("Redis CPU ms/s at rest", lambda p: p.get("pop", {}).get("redis_cpu_ms_per_sec_at_rest")),
    ("replica CPU ms/s at rest", lambda p: p.get("pop", {}).get("replica_cpu_ms_per_sec_at_rest")),
    ("Redis CPU µs/stream/s", lambda p: p.get("net", {}).get("redis")),
    ("replica CPU µs/stream/s", lambda p: p.get("net", {}).get("replica")),
    ("Redis cmds/stream/s", lambda p: p.get("net", {}).get("cmds")),
    ("errors", lambda p: ", ".join(f"{k}: {v}" for k, v in p["load"].get("errors", {}).items()) or "none"),
]


def net(points):
    """Per call, net of what the population costs at rest (its CPU a second, at the load's calls a second, taken
    off the load's CPU a call: the cost a call adds); and per open stream at rest, with what an empty fleet costs
    at rest (the `sessions 0` point) taken off."""
    base = next((p.get("pop") for p in points if p["kind"] == "sessions" and p["n"] == 0), None) or {}
    for p in points:
        pop, load = p.get("pop"), p["load"]
        d = p.setdefault("net", {})
        rate = load.get("calls_per_sec")
        for key, per_call, at_rest in (("replica_call", "server_cpu_ms_per_call", "replica_cpu_ms_per_sec_at_rest"),
                                       ("redis_call", "redis_cpu_ms_per_call", "redis_cpu_ms_per_sec_at_rest")):
            if pop and rate and load.get(per_call) is not None and pop.get(at_rest) is not None:
                d[key] = load[per_call] - pop[at_rest] / rate
        if p["kind"] != "streams" or not pop or not p["n"]:
            continue
        for key, field, scale in (("redis", "redis_cpu_ms_per_sec_at_rest", 1e3),
                                  ("replica", "replica_cpu_ms_per_sec_at_rest", 1e3),
                                  ("cmds", "redis_cmds_per_sec_at_rest", 1)):
            if pop.get(field) is not None:
                d[key] = (pop[field] - (base.get(field) or 0)) * scale / p["n"]
        p["net"] = d


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        if v >= 100:
            return f"{v:.0f}"
        if v >= 1:
            return f"{v:.2f}"
        return f"{v:.4f}"
    return str(v)


def slope(points):
    """Least-squares bytes per session of Redis's used_memory over the sessions points (n > 0)."""
    with_pop = [p for p in points if p.get("pop") and p["n"] > 0]
    xs = [p["n"] for p in with_pop]
    ys = [p["pop"]["redis_used_memory"] for p in with_pop]
    if len(xs) < 2:
        return None, None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None, None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return b, my - b * mx


# --- SVG -------------------------------------------------------------------------------------------------------
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_max(v):
    if v <= 0:
        return 1.0
    import math

    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def label_n(n):
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def panel(out, x0, y0, w, h, title, xs, series, ylabel, xlabel, linear=False, note=None):
    """One chart: `xs` the x values (categorical, evenly spaced, unless `linear`), `series` (name, values)."""
    left, bottom, top, right = 60, 40, 28, 12
    pw, ph = w - left - right, h - top - bottom
    ox, oy = x0 + left, y0 + top
    vals = [v for _, vs in series for v in vs if v is not None]
    ymax = nice_max(max(vals) if vals else 1.0)
    xmax = max(xs) if xs and linear else 1

    def px(i):
        if linear:
            return ox + pw * (xs[i] / xmax if xmax else 0)
        return ox + (pw * (i + 0.5) / len(xs))

    def py(v):
        return oy + ph - ph * v / ymax

    out.append(f'<text x="{x0 + w / 2}" y="{y0 + 16}" text-anchor="middle" font-weight="bold">{esc(title)}</text>')
    out.append(f'<rect x="{ox}" y="{oy}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for k in range(5):
        v = ymax * k / 4
        y = py(v)
        out.append(f'<line x1="{ox}" y1="{y}" x2="{ox + pw}" y2="{y}" stroke="#eee"/>')
        out.append(f'<text x="{ox - 4}" y="{y + 4}" text-anchor="end" font-size="10">{v:g}</text>')
    last = None
    for i, x in enumerate(xs):
        # On a linear axis the small values crowd together: label only those with room.
        if last is not None and px(i) - last < 24:
            continue
        last = px(i)
        out.append(f'<text x="{px(i)}" y="{oy + ph + 14}" text-anchor="middle" font-size="10">{label_n(x)}</text>')
    out.append(f'<text x="{ox + pw / 2}" y="{oy + ph + 30}" text-anchor="middle" font-size="11">{esc(xlabel)}</text>')
    out.append(
        f'<text x="{x0 + 14}" y="{oy + ph / 2}" text-anchor="middle" font-size="11" '
        f'transform="rotate(-90 {x0 + 14} {oy + ph / 2})">{esc(ylabel)}</text>'
    )
    for s, (name, vs) in enumerate(series):
        c = COLORS[s % len(COLORS)]
        pts = [(px(i), py(v)) for i, v in enumerate(vs) if v is not None]
        if len(pts) > 1:
            out.append(
                f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                + '"/>'
            )
        for x, y in pts:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>')
        out.append(f'<rect x="{ox + 8}" y="{oy + 8 + 14 * s}" width="10" height="10" fill="{c}"/>')
        out.append(f'<text x="{ox + 22}" y="{oy + 17 + 14 * s}" font-size="10">{esc(name)}</text>')
    if note:
        out.append(f'<text x="{ox + pw - 6}" y="{oy + ph - 8}" text-anchor="end" font-size="10">{esc(note)}</text>')


def svg(points, path):
    ses = [p for p in points if p["kind"] == "sessions"]
    st = [p for p in points if p["kind"] == "streams"]
    W, H = 460, 260
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{3 * H}" font-family="sans-serif" '
        f'font-size="12"><rect width="100%" height="100%" fill="white"/>'
    ]
    get = lambda ps, k: [p["load"].get(k) for p in ps]  # noqa: E731
    pop = lambda ps, k: [p.get("pop", {}).get(k) for p in ps]  # noqa: E731
    cpu = [("replica", "server_cpu_ms_per_call"), ("Redis", "redis_cpu_ms_per_call")]
    netc = [("replica, net of rest", "replica_call"), ("Redis, net of rest", "redis_call")]
    nets = lambda ps, k: [p.get("net", {}).get(k) for p in ps]  # noqa: E731
    lat = [("p50", "p50_ms"), ("p99", "p99_ms")]
    if ses:
        xs = [p["n"] for p in ses]
        panel(out, 0, 0, W, H, "CPU per call, with idle sessions", xs,
              [(n, get(ses, k)) for n, k in cpu] + [(n, nets(ses, k)) for n, k in netc], "ms a call", "idle sessions")
        panel(out, 0, H, W, H, "Latency, with idle sessions", xs, [(n, get(ses, k)) for n, k in lat],
              "ms", "idle sessions")
        b, _ = slope(ses)
        mem = [(p["pop"]["redis_used_memory"] / 1e6 if p.get("pop") else None) for p in ses]
        panel(out, 0, 2 * H, W, H, "Redis used_memory, with idle sessions", xs, [("used_memory", mem)], "MB",
              "idle sessions (linear)", linear=True, note=f"slope {b:.0f} bytes a session" if b else None)
    if st:
        xs = [p["n"] for p in st]
        panel(out, W, 0, W, H, "CPU per call, with open streams", xs,
              [(n, get(st, k)) for n, k in cpu] + [(n, nets(st, k)) for n, k in netc], "ms a call", "open SSE streams")
        panel(out, W, H, W, H, "Latency, with open streams", xs, [(n, get(st, k)) for n, k in lat], "ms",
              "open SSE streams")
        panel(out, W, 2 * H, W, H, "Open streams at rest, per stream", xs,
              [("Redis CPU µs/s", [p.get("net", {}).get("redis") for p in st]),
               ("replica CPU µs/s", [p.get("net", {}).get("replica") for p in st]),
               ("replica RSS KB", [(v / 1024 if v is not None else None)
                                   for v in pop(st, "replica_rss_bytes_per_session")])],
              "per stream", "open SSE streams")
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")


def main():
    rows, out = sys.argv[1], Path(sys.argv[2])
    points = [p for p in load(rows) if "load" in p]
    net(points)
    print("| " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for p in points:
        print("| " + " | ".join(fmt(f(p)) for _, f in COLUMNS) + " |")
    b, a = slope([p for p in points if p["kind"] == "sessions"])
    if b is not None:
        print(f"\nRedis used_memory = {a / 1e6:.2f} MB + {b:.0f} bytes × idle sessions (least squares over the sessions points with n > 0)")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "growth.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([c for c, _ in COLUMNS])
        for p in points:
            w.writerow([fmt(fn(p)) for _, fn in COLUMNS])
    svg(points, out / "growth.svg")
    print(f"\nwrote {out / 'growth.csv'} and {out / 'growth.svg'}", file=sys.stderr)


if __name__ == "__main__":
    main()
