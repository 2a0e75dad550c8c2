#!/usr/bin/env python3
"""Summarizes repeated serve-compare concurrency sweeps of one server, per label.

Usage: scripts/sweep_runs_summary.py [--server NAME] LABEL=DIR[,DIR...] ...

Each DIR holds a serve-compare.json. For each family and client count, per label: the per-run
TTFT p50s and their median, then the hits pooled over the runs (requests that restored at least
64 prompt tokens and did not wait for another lane's prefill): their TTFT p50, p75, p90 and mean.
A sweep level's TTFT p50 of 24 requests falls among the slowest hits when a third are cold, so
it moves by tens of ms between runs; the pooled hits say where their time went. Then the medians
over runs of throughput, goodput, TPOT p50 and the longest stall's p95.
"""
import json
import statistics
import sys


def main():
    args = sys.argv[1:]
    server = "skippy"
    if len(args) >= 2 and args[0] == "--server":
        server, args = args[1], args[2:]
    if not args or any("=" not in a for a in args):
        sys.exit(__doc__)
    levels = {}
    for arg in args:
        label, dirs = arg.split("=", 1)
        for d in dirs.split(","):
            for level in json.load(open(d + "/serve-compare.json"))["concurrency_sweep"]:
                if level["server"] != server:
                    continue
                g = levels.setdefault((level["family"], level["concurrency"]), {}).setdefault(label, {
                    "p50": [], "hits": [], "throughput": [], "goodput": [], "tpot": [], "stall": []})
                s = level["summary"]
                g["p50"].append(s["ttft_p50_ms"])
                g["throughput"].append(s["throughput_rps"])
                g["goodput"].append(s["goodput_rps"])
                g["tpot"].append(s["tpot_p50_ms"])
                g["stall"].append(s.get("max_gap_p95_ms", 0.0))
                g["hits"] += [r["ttft_ms"] for r in level["requests"]
                              if r["timings"].get("cache_n", 0) >= 64 and r["timings"].get("prefix_wait_ms", 0) == 0]
    med = statistics.median
    for (family, clients) in sorted(levels):
        print(f"{family}, {clients} clients")
        for label, g in levels[(family, clients)].items():
            h = sorted(g["hits"])
            hits = (f"hits n={len(h)} p50 {med(h):.0f} p75 {h[3 * len(h) // 4]:.0f} p90 {h[9 * len(h) // 10]:.0f} "
                    f"mean {statistics.mean(h):.0f}") if h else "no hits"
            print(f"  {label}: runs {len(g['p50'])}, TTFT p50 {[round(x) for x in g['p50']]} median {med(g['p50']):.0f}"
                  f" | {hits} | throughput {med(g['throughput']):.2f} goodput {med(g['goodput']):.2f}"
                  f" TPOT p50 {med(g['tpot']):.1f} stall p95 {med(g['stall']):.0f}")


if __name__ == "__main__":
    main()
