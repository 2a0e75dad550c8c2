#!/usr/bin/env python3
"""What --lane-batching=auto (skippy-server's default with 2+ lanes) decides, model by model.

    scripts/lane_batching_auto.py OUT.jsonl MODEL.gguf [MODEL.gguf ...] [--starts N] [--port P]

Starts build/bin/skippy-server on each MODEL N times (four lanes, 2 threads, 2048 tokens per lane,
the server's defaults otherwise), models in turn within each round, and records what /cache/stats
`lane_batching` says after startup: the lone decode step measured in the one-row class and without
it, their ratio, and whether lanes step together, with the seconds from launch to /health. Writes
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
                          "-t", "2", "--parallel", "4"], a.port)
            startup_s = time.monotonic() - t0
            try:
                lanes = get(a.port, "/cache/stats")["lane_batching"]
            finally:
                stop(proc)
            run = {"model": Path(model).name, "start": n, "startup_s": round(startup_s, 2), "lane_batching": lanes}
            runs.append(run)
            out.write(json.dumps(run) + "\n")
            out.flush()

for model in a.models:
    mine = [r for r in runs if r["model"] == Path(model).name]
    ratios = [r["lane_batching"].get("auto", {}).get("ratio") for r in mine]
    print(json.dumps({
        "model": Path(model).name,
        "ratios": ratios,
        "one_row_class_ms": [r["lane_batching"].get("auto", {}).get("one_row_class_ms") for r in mine],
        "default_ms": [r["lane_batching"].get("auto", {}).get("default_ms") for r in mine],
        "on": [r["lane_batching"].get("on") for r in mine],
        "median_startup_s": statistics.median(r["startup_s"] for r in mine),
    }))
