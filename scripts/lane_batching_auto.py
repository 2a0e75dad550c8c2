#!/usr/bin/env python3
"""What --one-row-class=auto and --lane-batching=auto (skippy-server's defaults) decide, model by model.

    scripts/lane_batching_auto.py OUT.jsonl MODEL.gguf [MODEL.gguf ...] [--starts N] [--lanes L] [--port P]

Starts build/bin/skippy-server on each MODEL N times (L lanes, default 4; 2 threads, 2048 tokens per
lane, the server's defaults otherwise), models in turn within each round, and records what
/cache/stats `one_row_class` and `lane_batching` say after startup: the lone decode step measured in
the one-row class and without it, their ratio, whether the class is on and whether lanes step
together, with the seconds from launch to /health. (Evidence written before the class had its own
switch holds the measure under `lane_batching.auto` instead.) Writes
one JSON line per start to OUT.jsonl and prints, per model, the ratios and decisions of its starts,
so a decision near the tolerance shows up as one that differs between starts.
"""
import argparse, json, statistics, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import get, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("out")
ap.add_argument("models", nargs="+")
ap.add_argument("--starts", type=int, default=3)
ap.add_argument("--lanes", type=int, default=4)
ap.add_argument("--port", type=int, default=18710)
a = ap.parse_args()
for m in a.models:
    if not Path(m).is_file():
        ap.error(f"no model at {m}")

runs = []
with open(a.out, "w") as out:
    for n in range(a.starts):
        for model in a.models:
            t0 = time.monotonic()
            proc = start([str(ROOT / "build/bin/skippy-server"), "-m", model, "--port", str(a.port), "-c", "2048",
                          "-t", "2", "--parallel", str(a.lanes)], a.port)
            startup_s = time.monotonic() - t0
            try:
                stats = get(a.port, "/cache/stats")
            finally:
                stop(proc)
            run = {"model": Path(model).name, "start": n, "lanes": a.lanes, "startup_s": round(startup_s, 2),
                   "one_row_class": stats["one_row_class"], "lane_batching": stats["lane_batching"]}
            runs.append(run)
            out.write(json.dumps(run) + "\n")
            out.flush()

for model in a.models:
    mine = [r for r in runs if r["model"] == Path(model).name]
    measured = [r["one_row_class"].get("measured", {}) for r in mine]
    print(json.dumps({
        "model": Path(model).name,
        "ratios": [m.get("ratio") for m in measured],
        "one_row_class_ms": [m.get("one_row_class_ms") for m in measured],
        "default_ms": [m.get("default_ms") for m in measured],
        "class_on": [r["one_row_class"].get("on") for r in mine],
        "lanes_together": [r["lane_batching"].get("on") for r in mine],
        "median_startup_s": statistics.median(r["startup_s"] for r in mine),
    }))
