#!/usr/bin/env python3
"""Compares AIPerf and llm-canary from one run of scripts/bench/aiperf-side-by-side.sh.

Reads AIPerf's per-request exports (`aiperf-acc-<N>/**/profile_export.jsonl`, `aiperf-tp/...`,
profiling phase only), the CPU times /usr/bin/time wrote next to them, and the canary's
`canary.jsonl` (the client benchmark, `benches/client.rs`, with --json), and prints a Markdown table per measurement with the
ratio AIPerf / llm-canary.

    compare-aiperf.py OUT_DIR DURATION_S OSL N [N ...]
"""
import json
import pathlib
import sys


def pct(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def aiperf_records(folder):
    rows = []
    for f in folder.rglob("profile_export.jsonl"):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row.get("metadata", {}).get("benchmark_phase") == "warmup":
                continue
            m = row.get("metrics", {})
            value = lambda k: (m.get(k) or {}).get("value")
            rows.append((value("time_to_first_token"), value("inter_token_latency"),
                         value("output_sequence_length")))
    return rows


def cpu_seconds(path):
    try:
        user, system, _wall = path.read_text().split()[-3:]
        return float(user) + float(system)
    except (OSError, ValueError):
        return float("nan")


def ratio(a, b):
    return f"{a / b:.1f}x" if b and b == b and a == a else "n/a"


def main():
    out, duration, osl = pathlib.Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    levels = sys.argv[4:]
    canary = [json.loads(l) for l in (out / "canary.jsonl").read_text().splitlines()]
    print("## Timing accuracy (fixed profile: TTFT 100 ms, ITL 10 ms; open-loop arrivals)\n")
    print("| streams | tool | requests | TTFT − 100 ms p50 / p99 / max | abs(ITL − 10 ms) p50 / p99 | load delivered |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in levels:
        rows = aiperf_records(out / f"aiperf-acc-{n}")
        ttft = [r[0] - 100.0 for r in rows if r[0] is not None]
        itl = [abs(r[1] - 10.0) for r in rows if r[1] is not None]
        rate = int(n) / (0.1 + 0.01 * (osl - 1))
        delivered = len(rows) / (rate * duration) * 100 if rows else float("nan")
        print(f"| {n} | AIPerf | {len(rows)} | {pct(ttft, .5):.2f} / {pct(ttft, .99):.2f} / "
              f"{pct(ttft, 1):.2f} | {pct(itl, .5):.3f} / {pct(itl, .99):.3f} | {delivered:.0f} % |")
        c = next((r for r in canary if r["bench"] == "accuracy" and r["streams"] == int(n)), None)
        if c:
            t, i = c["ttft_minus_configured_ms"], c["itl_err_ms"]
            print(f"| {n} | llm-canary | {c['requests']} | {t['p50']:.2f} / {t['p99']:.2f} / "
                  f"{t['max']:.2f} | {i['p50']:.3f} / {i['p99']:.3f} | "
                  f"{c['delivered_ratio'] * 100:.0f} % |")
            print(f"| {n} | ratio (AIPerf / canary), p99 | | {ratio(pct(ttft, .99), t['p99'])} | "
                  f"{ratio(pct(itl, .99), i['p99'])} | |")
    print("\n## Throughput and cost (fast profile, closed loop)\n")
    rows = aiperf_records(out / "aiperf-tp")
    tokens = sum(r[2] or 0 for r in rows)
    a_tps = tokens / duration
    a_cpu = cpu_seconds(out / "aiperf-tp.time") / tokens * 1e6 if tokens else float("nan")
    c = next((r for r in canary if r["bench"] == "throughput"), {})
    c_tps, c_cpu = c.get("tokens_per_s", float("nan")), c.get("client_cpu_s_per_m_tokens", float("nan"))
    print("| tool | streams | tokens/s | client CPU-s per 1M tokens |")
    print("| --- | --- | --- | --- |")
    print(f"| AIPerf | {c.get('streams', '')} | {a_tps:,.0f} | {a_cpu:.1f} (whole run incl. start-up) |")
    print(f"| llm-canary | {c.get('streams', '')} | {c_tps:,.0f} | {c_cpu:.2f} |")
    print(f"| ratio | | canary {ratio(c_tps, a_tps)} faster | AIPerf {ratio(a_cpu, c_cpu)} the CPU |")


if __name__ == "__main__":
    main()
