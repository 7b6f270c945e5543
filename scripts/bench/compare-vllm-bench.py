#!/usr/bin/env python3
"""Compares vllm-bench and llm-canary from one run of scripts/bench/vllm-bench-side-by-side.sh.

Reads OUT_DIR/params.json and, per case, each tool's directory:
  paced-<N>/{canary,vllm-bench}/send.jsonl  the simulator's send log (x_request_id, arrival and
                                            every token's send instant, CLOCK_MONOTONIC ns)
  paced-<N>/canary/out/requests.jsonl       the canary's per-request records
  paced-<N>/vllm-bench/result.json          vllm-bench's result (--save-result --save-detailed)
  paced-per-event-<N>/...                   the same against a simulator writing each event alone
  zero-delay-<N>/...                        the same without send logs (and without
                                            --save-detailed for vllm-bench)
  */time                                    /usr/bin/time: user s, system s, wall s, max RSS KiB
and prints one Markdown table: each figure for both tools and the ratio, worse / better.
The figures' definitions are in the header of vllm-bench-side-by-side.sh.

    compare-vllm-bench.py OUT_DIR

Python 3 standard library only.
"""
import json
import pathlib
import re
import sys

NAN = float("nan")
STEADY_AFTER_S = 2.0
FIRST_S = 1.0
MS_PER_REQUEST_FIXED = lambda osl: 100.0 + 10.0 * (osl - 1)  # the `fixed` profile


def pct(values, q):
    values = sorted(values)
    if not values:
        return NAN
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    except OSError:
        pass
    return rows


def read_time(path):
    """/usr/bin/time -f '%U %S %e %M': (CPU s, wall s, max RSS MiB)."""
    try:
        user, system, wall, rss = path.read_text().split()[-4:]
        return float(user) + float(system), float(wall), float(rss) / 1024.0
    except (OSError, ValueError):
        return NAN, NAN, NAN


def server_records(path):
    """x_request_id -> (server TTFT ms, server mean ITL ms or None, token count)."""
    out = {}
    for s in read_jsonl(path):
        rid, tokens = s.get("x_request_id"), s.get("token_mono_ns") or []
        if rid is None or not tokens:
            continue
        if rid in out and not s.get("ok", True):
            continue  # a retried request: keep the successful record
        # From the request's arrival at the simulator's host (the kernel's stamp), not from when
        # the simulator, busy on the same cores as the tool, got to read it: a late read is a
        # slow server, which both tools see alike. Older send logs have only `received_mono_ns`.
        arrived = s.get("arrived_mono_ns", s["received_mono_ns"])
        ttft = (tokens[0] - arrived) / 1e6
        itl = (tokens[-1] - tokens[0]) / 1e6 / (len(tokens) - 1) if len(tokens) >= 2 else None
        out[rid] = (ttft, itl, len(tokens))
    return out


class Run:
    """One tool's requests in one case, reduced to what the table needs."""

    def __init__(self):
        self.ok = self.failed = self.unmatched = 0
        self.first, self.steady, self.itl, self.itl_reported = [], [], [], []
        self.tokens = 0
        self.steady_n, self.steady_span_s = 0, NAN
        self.tokens_per_s = NAN
        self.cpu_s, self.wall_s, self.rss_mib = NAN, NAN, NAN
        self.notes = []

    def add(self, at_s, ttft_ms, itl_ms, itl_reported_ms, server):
        ttft_server, itl_server, _n = server
        error = ttft_ms - ttft_server
        if at_s < FIRST_S:
            self.first.append(error)
        if at_s >= STEADY_AFTER_S:
            self.steady.append(error)
            if itl_server is not None:
                if itl_ms is not None:
                    self.itl.append(abs(itl_ms - itl_server))
                if itl_reported_ms is not None:
                    self.itl_reported.append(abs(itl_reported_ms - itl_server))

    def cpu_per_m(self):
        return self.cpu_s / (self.tokens / 1e6) if self.tokens else NAN


def canary_run(folder, sent):
    run = Run()
    run.cpu_s, run.wall_s, run.rss_mib = read_time(folder / "time")
    lines = read_jsonl(folder / "out" / "requests.jsonl")
    if not lines:
        run.notes.append("no requests.jsonl")
        return run
    t0 = min(l["intended_start_mono_ns"] for l in lines)
    last_steady = None
    ok = [l for l in lines if l.get("outcome") == "ok"]
    run.ok, run.failed = len(ok), len(lines) - len(ok)
    run.tokens = sum(l.get("completion_tokens") or 0 for l in ok)
    if ok:
        span = (max(l["end_mono_ns"] for l in ok) - min(l["start_mono_ns"] for l in ok)) / 1e9
        run.tokens_per_s = run.tokens / span if span > 0 else NAN
    if sent is None:
        return run
    for l in ok:
        s = sent.get(l["x_request_id"])
        if s is None or l.get("ttft_ms") is None:
            run.unmatched += 1
            continue
        at = (l["intended_start_mono_ns"] - t0) / 1e9
        if at >= STEADY_AFTER_S:
            run.steady_n += 1
            last_steady = at if last_steady is None else max(last_steady, at)
        itl = l.get("itl_ms")
        run.add(at, l["ttft_ms"], itl, itl, s)
    if last_steady is not None:
        run.steady_span_s = last_steady - STEADY_AFTER_S
    return run


def vllm_bench_run(folder, sent, prefix, api):
    run = Run()
    run.cpu_s, run.wall_s, run.rss_mib = read_time(folder / "time")
    try:
        r = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        run.notes.append("no result.json")
        return run
    run.ok, run.failed = int(r.get("completed", 0)), int(r.get("failed", 0))
    try:
        generated = re.search(r"Generated \d+ prompts in ([0-9.]+)s", (folder / "log").read_text())
        if generated:
            run.notes.append(f"prompts generated in {generated.group(1)} s")
    except OSError:
        pass
    run.tokens = int(r.get("total_output_tokens") or 0)
    duration = r.get("duration") or 0
    run.tokens_per_s = run.tokens / duration if duration else NAN
    if sent is None:
        return run
    ttfts, itls, starts = r.get("ttfts"), r.get("itls"), r.get("start_times")
    errors, out_lens = r.get("errors") or [], r.get("output_lens") or []
    if ttfts is None or itls is None or starts is None:
        run.notes.append("result.json has no per-request arrays (--save-detailed)")
        return run
    t0 = min(starts) if starts else 0.0
    last_steady, unaligned = None, 0
    for i, (ttft, gaps, start) in enumerate(zip(ttfts, itls, starts)):
        if (i < len(errors) and errors[i]) or (i < len(out_lens) and not out_lens[i]):
            continue  # a failed request
        s = sent.get(f"{prefix}{i}")
        if s is None or not ttft:
            run.unmatched += 1
            continue
        at = start - t0
        if at >= STEADY_AFTER_S:
            run.steady_n += 1
            last_steady = at if last_steady is None else max(last_steady, at)
        # Its stamps of every chunk with choices: the chat role chunk (same frame as the first
        # token) first, the finish_reason chunk last. The content tokens are the n in between.
        n = s[2]
        arrivals = [ttft]
        for g in gaps:
            arrivals.append(arrivals[-1] + g)
        lead = 1 if api == "chat" and len(arrivals) >= n + 2 else 0
        tokens = arrivals[lead:lead + n]
        itl = None
        if len(tokens) == n and n >= 2:
            itl = (tokens[-1] - tokens[0]) * 1e3 / (n - 1)
        elif n >= 2:
            unaligned += 1
        reported = sum(gaps) * 1e3 / len(gaps) if gaps else None
        run.add(at, ttft * 1e3, itl, reported, s)
    if unaligned:
        run.notes.append(f"{unaligned} requests with fewer chunk stamps than server tokens")
    if last_steady is not None:
        run.steady_span_s = last_steady - STEADY_AFTER_S
    return run


def fmt(v, digits=2):
    if v != v:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def compare(canary, vllm_bench, higher_is_better=False):
    """'R× (tool ahead)': the worse figure over the better one."""
    c, v = canary, vllm_bench
    if c != c or v != v:
        return "n/a"
    if c == v:
        return "1.0× (even)"
    if c <= 0 or v <= 0:
        ahead = "llm-canary" if (c > v) == higher_is_better else "vllm-bench"
        return f"n/a ({ahead} ahead)"
    canary_ahead = (c > v) if higher_is_better else (c < v)
    ratio = max(c, v) / min(c, v)
    return f"{ratio:.1f}× ({'llm-canary' if canary_ahead else 'vllm-bench'} ahead)"


def main():
    out = pathlib.Path(sys.argv[1])
    params = json.loads((out / "params.json").read_text())
    api = params.get("api", "chat")
    rows, detail = [], []

    def row(name, c, v, digits=2, higher=False):
        rows.append(f"| {name} | {fmt(c, digits)} | {fmt(v, digits)} | {compare(c, v, higher)} |")

    paced = [("paced", n) for n in params["streams"]]
    paced += [("paced-per-event", n) for n in params.get("per_event_streams", [])]
    for name, n in paced:
        case = out / f"{name}-{n}"
        c = canary_run(case / "canary", server_records(case / "canary" / "send.jsonl"))
        v = vllm_bench_run(case / "vllm-bench", server_records(case / "vllm-bench" / "send.jsonl"),
                           f"vb-{name}{n}-", api)
        label = f"{name.replace('-', ' ')} {n}"
        row(f"{label}: TTFT error p50, ms (steady, from 2 s)", pct(c.steady, .5), pct(v.steady, .5))
        row(f"{label}: TTFT error p99, ms (steady)", pct(c.steady, .99), pct(v.steady, .99))
        row(f"{label}: TTFT error p99, ms (first second)", pct(c.first, .99), pct(v.first, .99))
        row(f"{label}: ITL error p99, ms (steady)", pct(c.itl, .99), pct(v.itl, .99), 3)
        row(f"{label}: ITL error p99, ms, as reported (vllm-bench: mean of its `itls`)",
            pct(c.itl_reported, .99), pct(v.itl_reported, .99), 3)
        row(f"{label}: CPU-s per 1M tokens", c.cpu_per_m(), v.cpu_per_m())
        row(f"{label}: peak RSS, MiB", c.rss_mib, v.rss_mib, 1)
        # Closed loop: N starts per request time, so the starts from 2 s to the last one cover
        # that span plus one request time.
        request_s = MS_PER_REQUEST_FIXED(params["osl"]) / 1e3
        for tool, r in (("llm-canary", c), ("vllm-bench", v)):
            window = r.steady_span_s + request_s
            delivered = r.steady_n / (window * n / request_s) if window == window else NAN
            detail.append(
                f"| {label} | {tool} | {r.ok} | {r.failed} | {r.unmatched} | {len(r.steady)} / "
                f"{len(r.first)} | {fmt(delivered * 100, 1)} % | {r.tokens:,} | {fmt(r.cpu_s)} | "
                f"{fmt(r.wall_s, 1)} | {'; '.join(r.notes)} |")

    n = params["tp_streams"]
    case = out / f"zero-delay-{n}"
    c = canary_run(case / "canary", None)
    v = vllm_bench_run(case / "vllm-bench", None, f"vb-tp{n}-", api)
    label = f"zero-delay {n}"
    row(f"{label}: streamed tokens/s", c.tokens_per_s, v.tokens_per_s, 0, higher=True)
    row(f"{label}: CPU-s per 1M tokens", c.cpu_per_m(), v.cpu_per_m())
    row(f"{label}: peak RSS, MiB", c.rss_mib, v.rss_mib, 1)
    for tool, r in (("llm-canary", c), ("vllm-bench", v)):
        detail.append(f"| {label} | {tool} | {r.ok} | {r.failed} | | | | {r.tokens:,} | "
                      f"{fmt(r.cpu_s)} | {fmt(r.wall_s, 1)} | {'; '.join(r.notes)} |")

    print(f"## llm-canary vs vllm-bench ({params.get('vllm_bench', '?')}), same simulator, one run\n")
    print(f"Machine: {params['cores']} cores, load average {params['loadavg']} at start. "
          f"Paced: `fixed` profile (TTFT 100 ms, ITL 10 ms), ISL {params['isl']}, OSL "
          f"{params['osl']}, closed loop, {params['duration']} s; zero-delay: `fast` profile on "
          f"{params.get('tp_sim_threads', 'one per core')} runtime thread(s), OSL "
          f"{params['tp_osl']} (vllm-bench over {params['tp_prompts']:,} requests); API "
          f"{api}. Errors are against the simulator's send instants, joined on x-request-id.\n")
    print("| figure | llm-canary | vllm-bench | ratio (worse / better) |")
    print("| --- | --- | --- | --- |")
    print("\n".join(rows))
    print("\n| case | tool | ok | failed | ok without server record | TTFT samples steady / "
          "first s | ≈ delivered (steady, of N streams ÷ request time) | tokens | CPU-s | wall s | notes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(detail))


if __name__ == "__main__":
    main()
