#!/usr/bin/env python3
"""Prints each request of a serve-compare concurrency sweep in the order it was sent.

Usage: scripts/sweep_timeline.py SERVE_COMPARE_JSON [CLIENTS]

One block per sweep level (server and client count; only CLIENTS clients when given): the level's
TTFT p50 and throughput, then per request the client thread that sent it, when (ms after the
level's start), its TTFT and end-to-end time, and the server's own timings (tokens restored from
the cache, tokens prefilled, and prompt_ms: from the start of the request's turn on the server to
its last prefill chunk; skippy-server also reports wait_ms: how long the request waited in a lane for
another lane's prefill of a prefix they share). Requests that a burst of clients sent together show as sent times a few
ms apart; their TTFTs then tell whether each waited for the others' prefills.
"""
import json
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    doc = json.load(open(sys.argv[1]))
    only = int(sys.argv[2]) if len(sys.argv) == 3 else None
    for level in doc.get("concurrency_sweep", []):
        if only is not None and level["concurrency"] != only:
            continue
        s = level.get("summary", {})
        print(f"{level['server']}, {level['concurrency']} clients: TTFT p50 {s.get('ttft_p50_ms', 0):.0f} ms, "
              f"{s.get('throughput_rps', 0):.2f} requests/s")
        reqs = level.get("requests")
        if reqs is None:
            print("  (no per-request records: written before serve-compare kept them)")
            continue
        print("  req client stream   sent_ms  ttft_ms   e2e_ms cache_n prompt_n prompt_ms wait_ms")
        for i, r in sorted(enumerate(reqs), key=lambda x: x[1]["sent_ms"]):
            t = r.get("timings", {})
            pm = t.get("prompt_ms")
            wm = t.get("prefix_wait_ms")
            print(f"  {i:3d} {r['client']:6d} {r['stream']:7s} {r['sent_ms']:8.0f} {r['ttft_ms']:8.0f} {r['e2e_ms']:8.0f} "
                  f"{str(t.get('cache_n', '-')):>7s} {str(t.get('prompt_n', '-')):>8s} "
                  f"{'-' if pm is None else f'{pm:.0f}':>9s} {'-' if wm is None else f'{wm:.0f}':>7s}")


if __name__ == "__main__":
    main()
