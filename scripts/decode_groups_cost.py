#!/usr/bin/env python3
"""What lanes decoding together gain, by how the decoding lanes are grouped: 1 to 4 clients.

    scripts/decode_groups_cost.py MODEL.gguf OUT.jsonl [REPEATS] [PORT]

Four servers on MODEL, each with four lanes or slots, 2 threads, 2048 tokens per lane, flash
attention on, no prompt cache, started one at a time in a rotating order REPEATS times:
  one-at-a-time   skippy-server --lane-batching=off --one-row-class=off (lanes decode one at a time)
  together-all    skippy-server --lane-batching --lane-groups all (every decoding lane in one step)
  together        skippy-server --lane-batching (groups by the step costs measured at startup)
  llama-server    the stock llama-server (-np 4 -fa on --cache-ram 0 --fit off)
Each time it sends bursts of 1, 2, 3 and 4 clients at once (short distinct prompts, 64 generated
tokens each, greedy, ignore_eos, streamed) and records the burst's generated tokens per second of
wall time. llama-server sometimes ends a stream of synthetic-weight text with an error event from
its output parser, after the tokens: those count, and the errors are listed.
Writes one JSON line per server run to OUT.jsonl and prints the medians per mode and client count,
with skippy-server's measured step costs.
"""
import json, statistics, sys, urllib.error, urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import at_once, get, rotating_runs, start  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
model, out_path = sys.argv[1], sys.argv[2]
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 2
port = int(sys.argv[4]) if len(sys.argv) > 4 else 18690
N_PREDICT = 64
SKIPPY = [str(ROOT / "build/bin/skippy-server"), "-c", "8192", "--parallel", "4", "--no-cache"]
MODES = {
    "one-at-a-time": SKIPPY + ["--lane-batching=off", "--one-row-class=off"],
    "together-all": SKIPPY + ["--lane-batching", "--lane-groups", "all"],
    "together": SKIPPY + ["--lane-batching"],
    "llama-server": [str(ROOT / "build/bin/llama-server"), "-c", "8192", "-np", "4", "-fa", "on", "--cache-ram", "0",
                     "--fit", "off", "--no-webui"],
}


def stream(body, errors):
    """POSTs a streamed /completion; returns predicted_n from the last event's timings. Streamed,
    since llama-server answers some non-streamed synthetic-weight outputs with a 500 (its output
    parser) after generating them."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    n, events = None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode(errors="replace").strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if "timings" in event:
                    n = event["timings"]["predicted_n"]
                elif "error" in event:
                    # llama-server's output parser can fail on synthetic-weight text after the
                    # tokens were generated and streamed: count them, and the error.
                    errors.append(json.dumps(event)[:300])
                    return events
                else:
                    events += 1
    return n


def burst(clients, tag):
    out, errors = [None] * clients, []

    def one(i):
        prompt = f"Request {tag}-{i}: tell me about rivers, stones and harbors number {i}"
        try:
            out[i] = stream({"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "ignore_eos": True,
                             "cache_prompt": False}, errors)
        except urllib.error.HTTPError as e:  # counted as no tokens
            errors.append(e.read().decode(errors="replace")[:300])

    wall = at_once(clients, one)
    tokens = sum(n for n in out if n)
    return {"clients": clients, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "errors": errors}


def measure(name, rep):
    stream({"prompt": "warm up", "n_predict": 4}, [])
    r = {"bursts": [burst(c, f"{rep}{name}{c}") for c in (1, 2, 3, 4)]}
    if name != "llama-server":
        lanes = get(port, "/cache/stats")["lane_batching"]
        r["step_cost"] = lanes.get("step_cost")
        r["steps_together"] = lanes.get("steps_together")
    return r


runs = rotating_runs(MODES, repeats, out_path,
                     lambda cmd: start(cmd + ["-m", model, "--port", str(port), "-t", "2"], port), measure)
summary = {"model": model, "repeats": repeats, "n_predict": N_PREDICT, "tokens_per_s": {}}
for name in MODES:
    summary["tokens_per_s"][name] = {
        c: round(statistics.median(b["tokens_per_s"] for r in runs if r["mode"] == name for b in r["bursts"]
                                   if b["clients"] == c), 1) for c in (1, 2, 3, 4)}
summary["step_ms"] = [r["step_cost"]["step_ms"] for r in runs if r["mode"] == "together" and r.get("step_cost")]
summary["errors"] = sum(len(b["errors"]) for r in runs for b in r["bursts"])
print(json.dumps(summary), flush=True)
