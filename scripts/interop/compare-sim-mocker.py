#!/usr/bin/env python3
"""Compares the shapes of one plan measured against Dynamo's mocker stacks and against the
embedded simulator set to the mocker's timing (scripts/interop/sim-vs-mocker.sh).

    compare-sim-mocker.py OUT_DIR

Reads OUT_DIR/{mocker,sim}/summary.json (the bench's step results) and the `/metrics` texts
OUT_DIR/{mocker,sim}-metrics.txt, and prints Markdown: TTFT p50 per concurrency and mode with the
growth from the lowest to the highest level, disaggregated against aggregated at short prompts,
TTFT per prefix hit ratio with the drop from 0 to 100 %, the mean handoff after the server's
first token, each with whether the simulator's shape agrees with the mocker's; then every metric
name the simulator exports that the real stacks do not, and whether a real engine has it (vLLM's
names from tests/testdata/vllm/metric-names.txt, KVBM's from
tests/testdata/dynamo/kvbm-metric-names.txt). Exits 1 when a name is the simulator's invention.
"""

import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def steps(out, side):
    return json.loads((out / side / "summary.json").read_text())["steps"]


def p50_ms(step):
    ttft = step.get("ttft")
    return None if not ttft else ttft["p50"] * 1e3


def pick(all_steps, workload, mode, **labels):
    """The step of `workload` in `mode` with exactly these step labels, or else the per-target
    total of a step whose labels include them (a distribution's ISL buckets)."""
    mine = [s for s in all_steps if s["workload"] == workload and s["serving_mode"] == mode]
    exact = [s for s in mine if s["labels"] == labels]
    if exact:
        return exact[-1]
    within = [s for s in mine if all(s["labels"].get(k) == v for k, v in labels.items())]
    totals = [s for s in within if s.get("total")]
    if totals:
        return totals[-1]
    # A step whose requests fell in one ISL bucket has that bucket's result and no total.
    return within[0] if len(within) == 1 else None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def names(path):
    """Family names of an exposition (histogram and counter suffixes folded)."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
        out.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return out


def listed(path):
    if not path.exists():
        return set()
    return {re.sub(r"_(bucket|sum|count)$", "", l.strip()) for l in path.read_text().splitlines()
            if l.strip() and not l.startswith("#")}


def main():
    out = pathlib.Path(sys.argv[1])
    sides = {side: steps(out, side) for side in ("mocker", "sim")}
    modes = ("aggregated", "disaggregated")
    rows, verdicts = [], []

    # TTFT against concurrency.
    levels = sorted({int(s["labels"]["concurrency"]) for s in sides["mocker"]
                     if s["workload"] == "concurrency_sweep"})
    growth = {}
    for mode in modes:
        for side, all_steps in sides.items():
            values = [p50_ms(pick(all_steps, "concurrency_sweep", mode, concurrency=str(c)) or {})
                      for c in levels]
            rows.append((f"TTFT p50 at concurrency {', '.join(map(str, levels))} (ms)", mode, side,
                         " / ".join(fmt(v) for v in values)))
            if values and values[0] and values[-1]:
                growth[(mode, side)] = values[-1] / values[0]
        m, s = growth.get((mode, "mocker")), growth.get((mode, "sim"))
        if m and s:
            verdicts.append((f"TTFT growth, concurrency {levels[0]} → {levels[-1]}, {mode}",
                             f"{m:.2f}×", f"{s:.2f}×", 0.5 <= s / m <= 2.0))

    # Disaggregated against aggregated at short prompts.
    for what, workload, labels in (("lowest sweep level", "concurrency_sweep",
                                    {"concurrency": str(levels[0])} if levels else {}),
                                   ("short prompts (sequence distribution)",
                                    "sequence_distribution", {"distribution": "uniform"})):
        delta = {}
        for side, all_steps in sides.items():
            a = p50_ms(pick(all_steps, workload, "aggregated", **labels) or {})
            d = p50_ms(pick(all_steps, workload, "disaggregated", **labels) or {})
            if a and d:
                delta[side] = d - a
                rows.append((f"TTFT p50 agg / disagg, {what} (ms)", "both", side,
                             f"{a:.1f} / {d:.1f}"))
        if len(delta) == 2:
            same = (delta["mocker"] > 0) == (delta["sim"] > 0)
            verdicts.append((f"disagg − agg TTFT p50, {what}", f"{delta['mocker']:+.1f} ms",
                             f"{delta['sim']:+.1f} ms", same))

    # TTFT against the prefix hit ratio.
    ratios = sorted({s["labels"]["prefix_ratio"] for s in sides["mocker"]
                     if s["workload"] == "prefix_cache"}, key=float)
    for mode in modes:
        drop = {}
        for side, all_steps in sides.items():
            values = [p50_ms(pick(all_steps, "prefix_cache", mode, prefix_ratio=r) or {})
                      for r in ratios]
            rows.append((f"TTFT p50 at prefix ratio {', '.join(ratios)} (ms)", mode, side,
                         " / ".join(fmt(v) for v in values)))
            if values and values[0] and values[-1]:
                drop[side] = (values[0] - values[-1]) / values[0] * 100
        if len(drop) == 2:
            verdicts.append((f"TTFT drop, prefix ratio {ratios[0]} → {ratios[-1]}, {mode}",
                             f"{drop['mocker']:.0f} %", f"{drop['sim']:.0f} %",
                             abs(drop["mocker"] - drop["sim"]) <= 20))

    # The same against the server's own TTFT (the step means of nvext.timing.ttft_ms): the
    # engines' shape, without the real frontend's own work (tokenizing and routing long prompts
    # costs it tens of milliseconds on a busy 2-core machine; the simulator has no such cost).
    for mode in modes:
        drop = {}
        for side, all_steps in sides.items():
            values = []
            for r in ratios:
                b = (pick(all_steps, "prefix_cache", mode, prefix_ratio=r) or {}).get("ttft_breakdown")
                values.append(b["server_ttft"] * 1e3 if b else None)
            rows.append((f"server TTFT mean at prefix ratio {', '.join(ratios)} (ms)", mode, side,
                         " / ".join(fmt(v) for v in values)))
            if values and values[0] and values[-1]:
                drop[side] = (values[0] - values[-1]) / values[0] * 100
        if len(drop) == 2:
            verdicts.append((f"server TTFT drop, prefix ratio {ratios[0]} → {ratios[-1]}, {mode}",
                             f"{drop['mocker']:.0f} %", f"{drop['sim']:.0f} %",
                             abs(drop["mocker"] - drop["sim"]) <= 20))

    # The handoff after the server's first token (mean over the sweep's lowest level).
    for mode in modes:
        handoff = {}
        for side, all_steps in sides.items():
            s = pick(all_steps, "concurrency_sweep", mode, concurrency=str(levels[0])) or {}
            b = s.get("ttft_breakdown")
            if b:
                handoff[side] = b["handoff"] * 1e3
        if len(handoff) == 2:
            verdicts.append((f"handoff + network after the server's TTFT, {mode}",
                             f"{handoff['mocker']:.1f} ms", f"{handoff['sim']:.1f} ms",
                             abs(handoff["mocker"] - handoff["sim"]) <= 15))

    print("## The simulator against Dynamo's mocker\n")
    print("| measure | mode | run | value |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("\n| shape | mocker | simulator | agrees |")
    print("| --- | --- | --- | --- |")
    for what, m, s, ok in verdicts:
        print(f"| {what} | {m} | {s} | {'yes' if ok else 'no'} |")

    real = names(out / "mocker-metrics.txt")
    vllm = listed(REPO / "tests/testdata/vllm/metric-names.txt")
    kvbm = listed(REPO / "tests/testdata/dynamo/kvbm-metric-names.txt")
    invented = []
    print("\n| simulator name the mocker stacks lack | where a real engine has it |")
    print("| --- | --- |")
    for name in sorted(names(out / "sim-metrics.txt") - real):
        where = "vLLM" if name in vllm else "Dynamo KVBM" if name in kvbm else None
        if where is None:
            invented.append(name)
        print(f"| `{name}` | {where or '**nowhere: the simulator invented it**'} |")
    if invented:
        print(f"\n{len(invented)} invented name(s): {', '.join(invented)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
