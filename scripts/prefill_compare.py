#!/usr/bin/env python3
"""Cold prefill time of two servers side by side (skippy-server and llama-server, same model).

    scripts/prefill_compare.py SKIPPY_PORT LLAMA_SERVER_PORT [RUNS]

Both servers up at once; each run sends each a new ~600-word prompt (never seen, so a cold
prefill), alternating which goes first, and reads `timings.prompt_ms` from the non-streamed
/completion answer. Prints both medians and skippy / llama-server (above 1: skippy is slower).
"""
import http.client, json, random, statistics, sys

ports = {"skippy": int(sys.argv[1]), "llama-server": int(sys.argv[2])}
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
res = {k: [] for k in ports}
for r in range(runs):
    order = list(ports) if r % 2 == 0 else list(reversed(list(ports)))
    for name in order:
        rng = random.Random(f"{r}-{name}")
        prompt = " ".join(rng.choice(words) + str(rng.randint(0, 999)) for _ in range(600))
        c = http.client.HTTPConnection("127.0.0.1", ports[name], timeout=300)
        c.request("POST", "/completion", json.dumps({"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}), {"Content-Type": "application/json"})
        t = json.loads(c.getresponse().read())["timings"]
        res[name].append((t["prompt_n"], t["prompt_ms"]))
for k, v in res.items():
    print(k, "prompt_n", v[0][0], "median prompt_ms %.1f" % statistics.median(x[1] for x in v), [round(x[1]) for x in v])
m = {k: statistics.median(x[1] for x in v) for k, v in res.items()}
print("skippy / llama-server prefill time: %.3f" % (m["skippy"] / m["llama-server"]))
