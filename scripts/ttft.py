#!/usr/bin/env python3
"""Time to first token at the client for a cold request, a prefix hit and an exact repeat.

    scripts/ttft.py PORT [RUNS]

Talks to any server with llama-server's streaming /completion (skippy-server, llama-server).
Cold: a prompt the server has never seen. Prefix hit: the same long prefix with a new ending.
Exact repeat: a prompt sent before, unchanged. Prints the median of RUNS for each, in ms.
"""
import http.client, json, statistics, sys, time

port = int(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
prefix = " ".join(f"Section {i}: the cache keeps exact state for shared prefixes." for i in range(14))

def ttft(prompt):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"prompt": prompt, "n_predict": 4, "temperature": 0, "stream": True, "cache_prompt": True})
    t0 = time.perf_counter()
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if line.startswith("data: ") and '"content"' in line:
            event = json.loads(line[6:])
            if not event.get("stop"):
                ms = (time.perf_counter() - t0) * 1000
                resp.read()
                conn.close()
                return ms
    raise RuntimeError("no token event")

cold, hit, repeat = [], [], []
for r in range(runs):
    p = f"Run {r} of {time.time_ns()}. " + prefix
    cold.append(ttft(p + " Question A?"))
    hit.append(ttft(p + " Question B, different?"))
    repeat.append(ttft(p + " Question B, different?"))
print(json.dumps({"cold_ms": statistics.median(cold), "prefix_hit_ms": statistics.median(hit),
                  "exact_repeat_ms": statistics.median(repeat), "runs": runs}))
