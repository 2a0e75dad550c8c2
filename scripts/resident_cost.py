#!/usr/bin/env python3
"""Cost of cached prefixes for requests that do not use them.

    scripts/resident_cost.py PORT [DOCUMENTS]

Sends DOCUMENTS (default 12) distinct ~950-token documents to a server with llama-server's
/completion (so a caching server holds them), then 7 fresh ~530-token prompts that share nothing
with them, and prints JSON with the median client time and server prompt_ms of the fresh prompts.
Compare one server layout against another on the same model: skippy-server and
skippy-server --no-cache, or any llama-server layout. (The shared-stream layout it was written
for, skippy-server --kv-unified, was removed; docs/evidence/resident-cost/ keeps that run.)
"""
import http.client, json, random, statistics, sys, time

port = int(sys.argv[1])
documents = int(sys.argv[2]) if len(sys.argv) > 2 else 12
rng = random.Random(1)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()

def text(n):
    return " ".join(rng.choice(words) for _ in range(n))

def complete(prompt):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = json.dumps({"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True})
    t0 = time.perf_counter()
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    return (time.perf_counter() - t0) * 1000, reply.get("timings", {})

for d in range(documents):
    complete(f"Document {d}: " + text(900))
fresh = [complete(f"Fresh {i} {time.time_ns()}: " + text(450)) for i in range(7)]
print(json.dumps({"documents": documents,
                  "fresh_client_ms_median": statistics.median(ms for ms, _ in fresh),
                  "fresh_prompt_ms_median": statistics.median(t.get("prompt_ms", 0) for _, t in fresh),
                  "fresh_prompt_tokens": fresh[0][1].get("prompt_n")}))
