#!/usr/bin/env python3
"""What --lane-batching buys and costs: decode time with and without it, one client and four.

    scripts/lane_batching_cost.py MODEL.gguf [REPEATS] [PORT] [LIB_DIR]

Starts build/bin/skippy-server on MODEL (2 threads, 2048-token context, four lanes) once with
--lane-batching=on and once with =off (and --one-row-class=off), alternating REPEATS times, and each time sends one request and
then four at once (short distinct prompts, 64 generated tokens, greedy, ignore_eos). Prints JSON
lines: per run the wall time of each burst and each request's predicted_ms, then the medians of
the per-token decode time (predicted_ms / 63) alone and of the four-client burst throughput
(tokens/s). Lane batching computes every lane's token in the kernels' one-row class (a pad row per
lane on a build without it; Engine::DecodeStep), so the lone-client number is the price and the
four-client one the gain. With LIB_DIR (another build's llama.cpp libraries, e.g. the bootstrap's
runtime folder of another patch series), a third mode runs the same binary batched with those
libraries (LD_LIBRARY_PATH), to measure a kernel change on the same server build.
"""
import json, os, statistics, sys

from serverproc import at_once, get, post, start, stop

model = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
port = int(sys.argv[3]) if len(sys.argv) > 3 else 18660
lib_dir = sys.argv[4] if len(sys.argv) > 4 else None
MODES = [("one_lane_at_a_time", False, None), ("batched", True, None)]
if lib_dir:
    MODES.append(("batched_lib_dir", True, lib_dir))
N_PREDICT = 64


def burst(clients, tag):
    out = [None] * clients

    def one(i):
        prompt = f"Request {tag}-{i}: tell me about rivers, stones and harbors number {i}"
        out[i] = post(port, "/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0,
                                            "ignore_eos": True})

    return at_once(clients, one), [r["timings"]["predicted_ms"] for r in out]


def run(mode, batching, libs, rep):
    flags = ["--lane-batching=on"] if batching else ["--lane-batching=off", "--one-row-class=off"]
    if libs:
        os.environ["LD_LIBRARY_PATH"] = libs
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)
    server = start(["build/bin/skippy-server", "-m", model, "--port", str(port), "-c", "2048", "-t", "2",
                    "--parallel", "4", "--no-cache"] + flags, port)
    try:
        wall1, alone = burst(1, f"{rep}a")
        wall4, four = burst(4, f"{rep}b")
        stats = get(port, "/cache/stats")
        return {"mode": mode, "lib_dir": libs, "lane_batching": batching, "on": stats["lane_batching"]["on"],
                "steps_together": stats["lane_batching"]["steps_together"], "alone_wall_s": wall1,
                "alone_predicted_ms": alone[0], "four_wall_s": wall4, "four_predicted_ms": four,
                "four_tokens_per_s": 4 * N_PREDICT / wall4}
    finally:
        stop(server)


runs = []
for rep in range(repeats):
    for mode, batching, libs in MODES:
        r = run(mode, batching, libs, rep)
        runs.append(r)
        print(json.dumps(r), flush=True)
summary = {"model": model, "repeats": repeats, "n_predict": N_PREDICT, "lib_dir": lib_dir}
for mode, _, _ in MODES:
    rs = [r for r in runs if r["mode"] == mode]
    summary[mode] = {"alone_ms_per_token": statistics.median(r["alone_predicted_ms"] / (N_PREDICT - 1) for r in rs),
                     "four_clients_tokens_per_s": statistics.median(r["four_tokens_per_s"] for r in rs)}
print(json.dumps(summary), flush=True)
