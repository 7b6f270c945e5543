#!/usr/bin/env python3
"""Compares AIPerf's and llm-canary's per-request measurements of one side-by-side run.

    compare-side-by-side.py OUT_DIR LEVEL...
    compare-side-by-side.py --aiperf-prompt-tokens OUT_DIR LEVEL

Reads AIPerf's `aiperf-c<LEVEL>/**/profile_export.jsonl` (profiling phase only, not warmup), the
canary's `canary-c<LEVEL>/requests.jsonl` (steady window, ok requests), and vLLM's `/metrics`
snapshots taken before and after each tool's run (`metrics-<tool>-c<LEVEL>-{before,after}.txt`).
Prints, per concurrency level, both tools' request count, prompt and output tokens (from usage),
TTFT p50/p99/mean and ITL p50/mean in milliseconds, next to the server's own mean TTFT and ITL over
the same run (increase of the TTFT and ITL histograms' sum / count: vLLM's
`vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds`, or Dynamo's frontend
`dynamo_frontend_time_to_first_token_seconds` and `dynamo_frontend_inter_token_latency_seconds`,
whichever the snapshots hold), then the canary/AIPerf ratios and each tool's excess over the
server's view.

The second form prints the median server-counted prompt length of AIPerf's requests at LEVEL (the
side-by-side script sets the canary's ISL to it).
"""

import json
import pathlib
import re
import statistics
import sys


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def aiperf(out, level):
    recs = []
    for f in (out / f"aiperf-c{level}").rglob("profile_export.jsonl"):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row.get("metadata", {}).get("benchmark_phase") == "warmup":
                continue
            m = row.get("metrics", {})
            if "time_to_first_token" in m and "inter_token_latency" in m:
                value = lambda k: m.get(k, {}).get("value")
                recs.append((value("time_to_first_token"), value("inter_token_latency"),
                             value("usage_prompt_tokens"), value("output_sequence_length")))
    return recs


def canary(out, level):
    recs = []
    path = out / f"canary-c{level}" / "requests.jsonl"
    if not path.exists():
        return recs
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["concurrency"] == str(level) and row["phase"] == "steady" and row["outcome"] == "ok":
            recs.append((row["ttft_ms"], row["itl_ms"], row["prompt_tokens"], row["completion_tokens"]))
    return recs


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


# The server's TTFT and ITL histograms: vLLM's engine, or Dynamo's frontend.
FAMILIES = (
    ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"),
    ("dynamo_frontend_time_to_first_token_seconds", "dynamo_frontend_inter_token_latency_seconds"),
)


def totals(path):
    """Sum of each `_sum` / `_count` series of the latency histograms in one scrape."""
    sums = {}
    if not path.exists():
        return sums
    wanted = {f + suffix for pair in FAMILIES for f in pair for suffix in ("_sum", "_count")}
    for line in path.read_text().splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) in wanted:
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
    return sums


def server_means(out, tool, level):
    """The server's mean TTFT and ITL (ms) over one tool's run, or None where it has no data."""
    before = totals(out / f"metrics-{tool}-c{level}-before.txt")
    after = totals(out / f"metrics-{tool}-c{level}-after.txt")
    families = next((pair for pair in FAMILIES if pair[0] + "_count" in after), FAMILIES[0])
    means = []
    for family in families:
        count = after.get(family + "_count", 0.0) - before.get(family + "_count", 0.0)
        total = after.get(family + "_sum", 0.0) - before.get(family + "_sum", 0.0)
        means.append(1e3 * total / count if count > 0 else None)
    return means


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def main():
    if sys.argv[1] == "--aiperf-prompt-tokens":
        recs = aiperf(pathlib.Path(sys.argv[2]), sys.argv[3])
        print(int(statistics.median(r[2] for r in recs if r[2] is not None)))
        return
    out, levels = pathlib.Path(sys.argv[1]), sys.argv[2:]
    print("| concurrency | tool | requests | prompt tokens | output tokens | TTFT p50 (ms) | "
          "TTFT p99 (ms) | TTFT mean (ms) | server TTFT mean (ms) | ITL p50 (ms) | ITL mean (ms) | "
          "server ITL mean (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    notes = []
    for level in levels:
        stats = {}
        for tool, key, recs in (("AIPerf", "aiperf", aiperf(out, level)),
                                ("llm-canary", "canary", canary(out, level))):
            server_ttft, server_itl = server_means(out, key, level)
            if not recs:
                print(f"| {level} | {tool} | 0 | - | - | - | - | - | {fmt(server_ttft)} | - | - | "
                      f"{fmt(server_itl, 2)} |")
                continue
            ttft, itl, isl, osl = zip(*recs)
            stats[tool] = (pct(ttft, 0.5), statistics.mean(ttft), statistics.mean(itl),
                           server_ttft, server_itl)
            kinds = lambda xs: ", ".join(str(x) for x in sorted(set(xs)))
            print(f"| {level} | {tool} | {len(recs)} | {kinds(isl)} | {kinds(osl)} | "
                  f"{pct(ttft, 0.5):.1f} | {pct(ttft, 0.99):.1f} | {statistics.mean(ttft):.1f} | "
                  f"{fmt(server_ttft)} | {pct(itl, 0.5):.2f} | {statistics.mean(itl):.2f} | "
                  f"{fmt(server_itl, 2)} |")
        if len(stats) == 2:
            a, c = stats["AIPerf"], stats["llm-canary"]
            notes.append(f"concurrency {level}: canary/AIPerf TTFT p50 {c[0] / a[0]:.2f}, "
                         f"TTFT mean {c[1] / a[1]:.2f}, ITL mean {c[2] / a[2]:.2f}")
        for tool, (_, ttft_mean, itl_mean, server_ttft, server_itl) in stats.items():
            if server_ttft is not None and server_itl is not None:
                notes.append(f"concurrency {level}, {tool}: TTFT mean {ttft_mean - server_ttft:+.1f} ms "
                             f"over the server's, ITL mean {itl_mean - server_itl:+.2f} ms")
    print()
    for n in notes:
        print(f"- {n}")


if __name__ == "__main__":
    main()
