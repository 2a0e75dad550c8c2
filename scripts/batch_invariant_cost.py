#!/usr/bin/env python3
"""What the batch-invariant kernels cost: skippy-server on the same model with and without them.

    scripts/batch_invariant_cost.py MODEL.gguf [ROUNDS] [PORT] [WORDS] [SERVER FLAGS...]

Each round starts build/bin/skippy-server --no-cache (2 threads, 2048-token context, one lane,
SERVER FLAGS) twice, once with its default batch-invariant kernels (the one-row class off unless
SERVER FLAGS choose it: what the kernels cost, not what the class saves) and once with
--no-batch-invariant (llama.cpp's stock ones), in alternating order, and sends each three
distinct prompts of WORDS word pairs (280: about 1,500 tokens) that share nothing, generating 32
tokens each. Prints JSON: per round and kernel set the median cold prefill (timings.prompt_ms)
and decode time per token (predicted_ms / predicted_n), and over all rounds the medians and the
invariant / stock ratios (above 1: the invariant kernels are slower).
"""
import json, statistics, sys

from serverproc import get, post, start, stop

model = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
port = int(sys.argv[3]) if len(sys.argv) > 3 else 18660
words = int(sys.argv[4]) if len(sys.argv) > 4 else 280
extra = sys.argv[5:]


def run(invariant, round_index):
    cmd = ["build/bin/skippy-server", "-m", model, "--port", str(port), "-c", "2048", "-t", "2", "--parallel", "1",
           "--no-cache"] + extra + ([] if invariant else ["--no-batch-invariant"])
    if invariant and not any(f.startswith("--one-row-class") for f in extra):
        cmd.append("--one-row-class=off")
    server = start(cmd, port)
    try:
        stats = get(port, "/cache/stats")
        if stats.get("batch_invariant") != invariant:
            raise SystemExit(f"server reports batch_invariant={stats.get('batch_invariant')}, wanted {invariant}")
        prefill, decode, n = [], [], 0
        for s in range(3):
            seed = round_index * 3 + s
            text = f"Doc {seed}: " + " ".join(f"w{(i * 7 + seed * 13) % 211} x{seed}" for i in range(words)) + "\nQ:"
            r = post(port, "/completion", {"prompt": text, "n_predict": 32, "temperature": 0, "ignore_eos": True})
            t = r["timings"]
            prefill.append(t["prompt_ms"])
            decode.append(t["predicted_ms"] / max(1, t["predicted_n"]))
            n = t["prompt_n"]
        return {"prompt_tokens": n, "prefill_ms": statistics.median(prefill), "decode_ms_per_token": statistics.median(decode)}
    finally:
        stop(server)


results = {"invariant": [], "stock": []}
for r in range(rounds):
    order = [True, False] if r % 2 == 0 else [False, True]
    for invariant in order:
        results["invariant" if invariant else "stock"].append(run(invariant, r))


def med(kind, key):
    return statistics.median(x[key] for x in results[kind])


out = {"model": model, "rounds": rounds, "server_flags": extra, "runs": results,
       "prompt_tokens": results["stock"][0]["prompt_tokens"]}
for key in ("prefill_ms", "decode_ms_per_token"):
    out[f"{key}_invariant"] = med("invariant", key)
    out[f"{key}_stock"] = med("stock", key)
    out[f"{key}_ratio"] = round(med("invariant", key) / med("stock", key), 4)
print(json.dumps(out))
