#!/usr/bin/env python3
"""What exact-boundary records cost a cold prefill: skippy-server with N records per prompt.

    scripts/record_cost.py MODEL.gguf RECORDS [PROMPTS] [PORT] [WORDS] [SERVER FLAGS...]

Starts build/bin/skippy-server on MODEL (2 threads, 2048-token context, one lane) with
--cache-max-records RECORDS and SERVER FLAGS, sends PROMPTS distinct prompts of WORDS word pairs
(330: about 1,800 tokens; 55: about 300) that share nothing (every one is a miss), and prints
JSON: each request's prompt_ms and in-prefill record_ms, and their medians. Compare RECORDS 0 with the default (10) on the same machine, alternating runs: the
difference is the extra prefill batches and state copies the records cost before the first token.
"""
import json, statistics, sys

from serverproc import post, start, stop

model, records = sys.argv[1], int(sys.argv[2])
prompts = int(sys.argv[3]) if len(sys.argv) > 3 else 5
port = int(sys.argv[4]) if len(sys.argv) > 4 else 18650
words = int(sys.argv[5]) if len(sys.argv) > 5 else 330

server = start(["build/bin/skippy-server", "-m", model, "--port", str(port), "-c", "2048", "-t", "2",
                "--parallel", "1", "--cache-max-records", str(records)] + sys.argv[6:], port)
try:
    prompt_ms, record_ms, n = [], [], 0
    for s in range(prompts):
        text = f"Doc {s}: " + " ".join(f"w{(i * 7 + s * 13) % 211} x{s}" for i in range(words)) + "\nQ:"
        r = post(port, "/completion", {"prompt": text, "n_predict": 1, "temperature": 0})
        prompt_ms.append(r["timings"]["prompt_ms"])
        record_ms.append(r["skippy"]["record_ms"])
        n = r["timings"]["prompt_n"]
    print(json.dumps({"model": model, "records": records, "server_flags": sys.argv[6:], "prompt_tokens": n, "prompt_ms": prompt_ms,
                      "record_ms": record_ms, "prompt_ms_median": statistics.median(prompt_ms),
                      "record_ms_median": statistics.median(record_ms)}))
finally:
    stop(server)
