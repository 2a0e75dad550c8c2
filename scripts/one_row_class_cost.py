#!/usr/bin/env python3
"""What the one-row class costs and buys: skippy-server on one model in three kernel modes.

    scripts/one_row_class_cost.py MODEL.gguf [ROUNDS] [PORT] [WORDS]

Modes, each a skippy-server --no-cache with two lanes (2 threads, 4096-token context):
  stock         --no-batch-invariant: llama.cpp's stock kernels (what llama-server computes with)
  invariant     --lane-batching=off --one-row-class=off: the batch-invariant kernels; lanes decode one at a time
  one-row       --lane-batching=on: the batch-invariant kernels' one-row class, lanes in one batch
Each round starts the three in a rotating order and sends, one at a time, three distinct prompts
of WORDS word pairs (280: about 1,500 tokens) generating 48 tokens each (cold prefill and decode
time per token, from the server's timings), then two such requests at once (aggregate generated
tokens per second of wall time, from the first request's start to the last one's end). Prints
JSON: per round and mode the medians, over all rounds the medians, and each mode's ratio to
invariant (decode: above 1 is slower; pair throughput: above 1 is faster).
"""
import json, statistics, sys, threading, time

from serverproc import get, post, start, stop

model = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
port = int(sys.argv[3]) if len(sys.argv) > 3 else 18670
words = int(sys.argv[4]) if len(sys.argv) > 4 else 280
N_PREDICT = 48

MODES = {
    "stock": ["--no-batch-invariant"],
    "invariant": ["--lane-batching=off", "--one-row-class=off"],
    "one-row": ["--lane-batching=on"],
}


def prompt(seed):
    return f"Doc {seed}: " + " ".join(f"w{(i * 7 + seed * 13) % 211} x{seed}" for i in range(words)) + "\nQ:"


def ask(seed):
    return post(port, "/completion",
                {"prompt": prompt(seed), "n_predict": N_PREDICT, "temperature": 0, "ignore_eos": True})


def run(mode, round_index):
    cmd = ["build/bin/skippy-server", "-m", model, "--port", str(port), "-c", "4096", "-t", "2", "--parallel", "2",
           "--no-cache"] + MODES[mode]
    server = start(cmd, port)
    try:
        stats = get(port, "/cache/stats")
        cls = stats.get("one_row_class", {})
        if (mode == "one-row") != bool(cls.get("on")) or (mode == "stock") == bool(stats.get("batch_invariant")):
            raise SystemExit(f"{mode}: server reports batch_invariant={stats.get('batch_invariant')} "
                             f"one_row_class={cls}")
        prefill, decode, n = [], [], 0
        for s in range(3):
            t = ask(round_index * 5 + s)["timings"]
            prefill.append(t["prompt_ms"])
            decode.append(t["predicted_ms"] / max(1, t["predicted_n"]))
            n = t["prompt_n"]
        # Two at once: both lanes busy for most of the generation.
        results = [None, None]

        def one(i):
            results[i] = ask(round_index * 5 + 3 + i)

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.monotonic() - t0
        generated = sum(r["timings"]["predicted_n"] for r in results)
        together = get(port, "/cache/stats").get("lane_batching", {}).get("steps_together", 0)
        return {"prompt_tokens": n, "prefill_ms": statistics.median(prefill),
                "decode_ms_per_token": statistics.median(decode),
                "pair_tokens_per_s": generated / wall, "pair_steps_together": together}
    finally:
        stop(server)


names = list(MODES)
results = {m: [] for m in names}
for r in range(rounds):
    order = names[r % 3:] + names[:r % 3]
    for mode in order:
        results[mode].append(run(mode, r))


def med(mode, key):
    return statistics.median(x[key] for x in results[mode])


out = {"model": model, "rounds": rounds, "n_predict": N_PREDICT, "runs": results,
       "prompt_tokens": results["invariant"][0]["prompt_tokens"], "medians": {}, "ratio_to_invariant": {}}
for mode in names:
    out["medians"][mode] = {k: round(med(mode, k), 3)
                            for k in ("prefill_ms", "decode_ms_per_token", "pair_tokens_per_s")}
    out["ratio_to_invariant"][mode] = {k: round(med(mode, k) / med("invariant", k), 4)
                                       for k in ("prefill_ms", "decode_ms_per_token", "pair_tokens_per_s")}
print(json.dumps(out))
