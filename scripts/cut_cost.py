#!/usr/bin/env python3
"""What skippy-server measures at startup for one more prefill batch on a model (/cache/stats
`cut_cost`, lane_cache::MeasureCutCost), over several starts.

    scripts/cut_cost.py MODEL.gguf OUT.json [--runs N] [--threads T] [--port P]

Starts build/bin/skippy-server on MODEL (one lane, 2048-token context, its defaults) RUNS times,
one at a time, reads `cut_cost` after each start and stops it. Writes the readings to OUT.json.
`cut_cost` is null for models that plan no exact-boundary records (dense attention families).
"""
import json, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import get, model_arguments, parse_model_arguments, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main():
    a = parse_model_arguments(model_arguments(__doc__, runs=2, port=18661))
    readings = []
    for _ in range(a.runs):
        server = start([str(ROOT / "build/bin/skippy-server"), "-m", a.model, "--port", str(a.port), "-c", "2048",
                        "-t", str(a.threads), "--parallel", "1"], a.port)
        try:
            readings.append(get(a.port, "/cache/stats")["cut_cost"])
        finally:
            stop(server)
    out = {"model": a.model, "threads": a.threads, "date": time.strftime("%Y-%m-%d"), "cut_cost": readings}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps([r and round(r["cost_rows"], 1) for r in readings]))


if __name__ == "__main__":
    main()
