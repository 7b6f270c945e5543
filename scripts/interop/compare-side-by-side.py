#!/usr/bin/env python3
"""Compares AIPerf's and llm-canary's per-request measurements of one side-by-side run.

    compare-side-by-side.py OUT_DIR LEVEL...

Reads AIPerf's `aiperf-c<LEVEL>/**/profile_export.jsonl` (profiling phase only, not warmup) and
the canary's `canary/requests.jsonl` (steady window, ok requests) and prints, per concurrency
level, both tools' request count, prompt and output tokens (from usage), TTFT p50/p99 and ITL
p50/mean in milliseconds as a Markdown table, then the canary/AIPerf ratios.
"""

import json
import pathlib
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
    for line in (out / "canary" / "requests.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["concurrency"] == level and row["phase"] == "steady" and row["outcome"] == "ok":
            recs.append((row["ttft_ms"], row["itl_ms"], row["prompt_tokens"], row["completion_tokens"]))
    return recs


def main():
    out, levels = pathlib.Path(sys.argv[1]), sys.argv[2:]
    print("| concurrency | tool | requests | prompt tokens | output tokens | TTFT p50 (ms) | "
          "TTFT p99 (ms) | ITL p50 (ms) | ITL mean (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ratios = []
    for level in levels:
        stats = {}
        for tool, recs in (("AIPerf", aiperf(out, level)), ("llm-canary", canary(out, level))):
            if not recs:
                print(f"| {level} | {tool} | 0 | - | - | - | - | - | - |")
                continue
            ttft, itl, isl, osl = zip(*recs)
            stats[tool] = (pct(ttft, 0.5), statistics.mean(itl))
            kinds = lambda xs: ", ".join(str(x) for x in sorted(set(xs)))
            print(f"| {level} | {tool} | {len(recs)} | {kinds(isl)} | {kinds(osl)} | "
                  f"{pct(ttft, 0.5):.1f} | {pct(ttft, 0.99):.1f} | {pct(itl, 0.5):.2f} | "
                  f"{statistics.mean(itl):.2f} |")
        if len(stats) == 2:
            (ta, ia), (tc, ic) = stats["AIPerf"], stats["llm-canary"]
            ratios.append(f"concurrency {level}: TTFT p50 canary/AIPerf {tc / ta:.2f}, "
                          f"ITL mean canary/AIPerf {ic / ia:.2f}")
    print()
    for r in ratios:
        print(f"- {r}")


if __name__ == "__main__":
    main()
