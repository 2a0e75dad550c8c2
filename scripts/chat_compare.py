#!/usr/bin/env python3
"""Chat-API latency, skippy-server vs llama-server, side by side on one model.

    scripts/chat_compare.py MODEL.gguf [REPEATS] [PORT] [-- SKIPPY FLAGS...]

serve-compare drives both servers with raw /completion prompts, which carry no message boundaries;
this drives /v1/chat/completions, where skippy-server knows where each message ends
(cache::BatchClasses). Starts build/bin/skippy-server (the flags after --, e.g. -fa on) and
build/bin/llama-server (its defaults: -fa auto, host-RAM prompt cache) with 2 threads, a 2048-token
context and one lane/slot, then sends three chat workloads to both, request by request in turn:
shared-prefix (a ~500-token system prompt, then short questions), multi-turn (three conversations
of three turns, interleaved, scripted replies) and agent-loop (tool results appended as user
messages). One generated token per request; latency is the client's request time. Prints JSON:
per workload and server the latencies (ms) of every repeat, their median, and the ratio of
llama-server's median to Skippy's (> 1: Skippy faster).
"""
import json, random, statistics, sys, time, urllib.request

from serverproc import start

args = sys.argv[1:]
extra = []
if "--" in args:
    extra = args[args.index("--") + 1:]
    args = args[:args.index("--")]
model = args[0]
repeats = int(args[1]) if len(args) > 1 else 2
port = int(args[2]) if len(args) > 2 else 18700

WORDS = ("cache request server prefix token model memory state restore exact system prompt user answer document "
         "section table query result latency shared context window layer batch lane slot queue budget policy").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def workloads(seed):
    rng = random.Random(seed)
    sys_msg = {"role": "system", "content": " ".join(sentence(rng, 12) for _ in range(34))}
    out = {"shared-prefix": [[sys_msg, {"role": "user", "content": sentence(rng, 20)}] for _ in range(6)]}
    convs = [[{"role": "system", "content": " ".join(sentence(rng, 12) for _ in range(17))}] for _ in range(3)]
    turns = []
    for _ in range(3):
        for c in convs:
            c.append({"role": "user", "content": sentence(rng, 20)})
            turns.append(list(c))
            c.append({"role": "assistant", "content": sentence(rng, 40)})
    out["multi-turn"] = turns
    agent = [{"role": "system", "content": "You are an agent. Tools: search, read, run. " +
              " ".join(sentence(rng, 12) for _ in range(17))}, {"role": "user", "content": sentence(rng, 20)}]
    steps = []
    for s in range(5):
        steps.append(list(agent))
        agent.append({"role": "assistant", "content": f"Call {s}: run(\"{sentence(rng, 4)}\")"})
        agent.append({"role": "user", "content": f"Result {s}: " + " ".join(sentence(rng, 10) for _ in range(5))})
    out["agent-loop"] = steps
    return out


def chat(p, messages):
    body = {"messages": messages, "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{p}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.loads(urllib.request.urlopen(req, timeout=600).read())
    return (time.perf_counter() - t0) * 1000, r


common = ["-m", model, "-c", "2048", "-t", "2", "-np", "1"]
servers = {
    "skippy": start(["build/bin/skippy-server", "--port", str(port)] + common + extra, port),
    "llama-default": start(["build/bin/llama-server", "--port", str(port + 1)] + common, port + 1),
}
ports = {"skippy": port, "llama-default": port + 1}
result = {"model": model, "skippy_flags": extra, "repeats": repeats, "workloads": {}}
try:
    for rep in range(repeats):
        for name, reqs in workloads(7 + rep).items():
            w = result["workloads"].setdefault(name, {k: {"ms": [], "cached": []} for k in servers})
            for msgs in reqs:
                for k in servers:
                    ms, r = chat(ports[k], msgs)
                    w[k]["ms"].append(round(ms, 2))
                    w[k]["cached"].append(r.get("timings", {}).get("cache_n", 0))
    for name, w in result["workloads"].items():
        for k in servers:
            w[k]["median_ms"] = statistics.median(w[k]["ms"])
        w["llama_over_skippy"] = round(w["llama-default"]["median_ms"] / w["skippy"]["median_ms"], 3)
    print(json.dumps(result))
finally:
    for s in servers.values():
        s.terminate()
        s.wait()
