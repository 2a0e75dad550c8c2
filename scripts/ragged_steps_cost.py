#!/usr/bin/env python3
"""What ragged steps gain: decoding lanes whose ids do not follow each other in one graph.

    scripts/ragged_steps_cost.py MODEL.gguf OUT.jsonl [--runs 2] [--lanes 8] [--rate 1.8]
                                 [--requests 40] [--threads 2] [--port 18700]

Requests arrive at random (Poisson, a fixed seed per run, the same for every server in a run), not
in closed loops: a closed-loop client refills its lane at once, so the busy lanes stay
consecutive, while arrivals at random leave free lanes between busy ones, as a server with more
lanes than its load has. Each request is a short distinct prompt and 32-192 generated tokens
(greedy, ignore_eos, streamed). Servers, --lanes lanes or slots each, 2048 tokens per lane, flash
attention on, no prompt cache, started one at a time in a rotating order --runs times:
  ragged-on    skippy-server --ragged-steps on (the default)
  ragged-off   skippy-server --ragged-steps off (one graph per run of consecutive lanes)
  llama-server the stock llama-server (-np LANES -fa on --cache-ram 0 --fit off)
Per run: generated tokens per second of the run's wall time (first request sent to last token),
each request's time per output token (after its first), the longest gap between two tokens, and
skippy-server's steps of lanes together and of lanes apart (/cache/stats). Writes one JSON line
per server run and prints the medians per server.
"""
import json, random, statistics, sys, threading, time, urllib.error, urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import get, model_arguments, parse_model_arguments, rotating_runs, start  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ap = model_arguments(__doc__, runs=2, port=18700)
ap.add_argument("--lanes", type=int, default=8)
ap.add_argument("--rate", type=float, default=1.8, help="requests per second")
ap.add_argument("--requests", type=int, default=40)
a = parse_model_arguments(ap)

ctx = str(2048 * a.lanes)
SKIPPY = [str(ROOT / "build/bin/skippy-server"), "-c", ctx, "--parallel", str(a.lanes), "--no-cache"]
MODES = {
    "ragged-on": SKIPPY + ["--ragged-steps", "on"],
    "ragged-off": SKIPPY + ["--ragged-steps", "off"],
    "llama-server": [str(ROOT / "build/bin/llama-server"), "-c", ctx, "-np", str(a.lanes), "-fa", "on",
                     "--cache-ram", "0", "--fit", "off", "--no-webui"],
}


def stream(body):
    """POSTs a streamed /completion; returns the client's arrival time of each token event. An
    error event after the tokens (llama-server's output parser on synthetic-weight text) ends it."""
    req = urllib.request.Request(f"http://127.0.0.1:{a.port}/completion", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    times, error = [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode(errors="replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = json.dumps(event)[:300]
                break
            if event.get("stop"):
                break
            times.append(time.monotonic())
    return times, error


def workload(seed):
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(a.requests):
        t += rng.expovariate(a.rate)
        reqs.append((t, {"prompt": f"Request {seed}-{i}: tell me about rivers, stones and harbors number {i}",
                         "n_predict": rng.randint(32, 192), "temperature": 0, "ignore_eos": True,
                         "cache_prompt": False}))
    return reqs


def run(seed):
    reqs = workload(seed)
    out = [None] * len(reqs)
    t0 = time.monotonic()

    def one(i):
        at, body = reqs[i]
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        sent = time.monotonic()
        try:
            times, error = stream(body)
        except urllib.error.HTTPError as e:
            times, error = [], e.read().decode(errors="replace")[:300]
        out[i] = {"sent": sent - t0, "times": [x - t0 for x in times], "error": error}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    last = max((o["times"][-1] for o in out if o["times"]), default=0.0)
    tokens = sum(len(o["times"]) for o in out)
    tpot = [(o["times"][-1] - o["times"][0]) / (len(o["times"]) - 1) * 1e3 for o in out if len(o["times"]) > 1]
    gaps = [max(y - x for x, y in zip(o["times"], o["times"][1:])) * 1e3 for o in out if len(o["times"]) > 1]
    ttft = [(o["times"][0] - o["sent"]) * 1e3 for o in out if o["times"]]
    return {"tokens": tokens, "wall_s": last, "tokens_per_s": tokens / last if last else 0,
            "tpot_p50_ms": statistics.median(tpot), "tpot_p95_ms": statistics.quantiles(tpot, n=20)[-1],
            "ttft_p50_ms": statistics.median(ttft), "longest_gap_p95_ms": statistics.quantiles(gaps, n=20)[-1],
            "errors": [o["error"] for o in out if o["error"]]}


def measure(name, rep):
    stream({"prompt": "warm up", "n_predict": 4})
    r = {"seed": rep, **run(seed=rep)}
    if name != "llama-server":
        lanes = get(a.port, "/cache/stats")["lane_batching"]
        r["steps_together"] = lanes.get("steps_together")
        r["ragged_steps"] = lanes.get("ragged_steps")
    print(name, rep, {k: r[k] for k in ("tokens_per_s", "tpot_p50_ms", "ttft_p50_ms")}, flush=True)
    return r


runs = rotating_runs(MODES, a.runs, a.out,
                     lambda cmd: start(cmd + ["-m", a.model, "--port", str(a.port), "-t", str(a.threads)], a.port), measure)
summary = {"model": a.model, "runs": a.runs, "lanes": a.lanes, "rate": a.rate, "requests": a.requests}
for name in MODES:
    mine = [r for r in runs if r["mode"] == name]
    summary[name] = {k: round(statistics.median(r[k] for r in mine), 2)
                     for k in ("tokens_per_s", "tpot_p50_ms", "tpot_p95_ms", "ttft_p50_ms", "longest_gap_p95_ms")}
    summary[name]["errors"] = sum(len(r["errors"]) for r in mine)
print(json.dumps(summary), flush=True)
