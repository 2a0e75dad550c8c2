#!/usr/bin/env python3
"""Where a cold prefill's time goes in skippy-server and in a stock llama-server: a `perf record`
of each over the same prompts, one server at a time.

    scripts/prefill_profile.py MODEL.gguf OUT_DIR [--runs N] [--threads T] [--port P] [-- SKIPPY_ARGS...]

Each server (one lane / one slot, 4096-token context, its defaults) is started, warmed with a short
prompt, then profiled (`perf record -F 1999 -p PID`) over RUNS new ~1,200-token prompts (the
prefill prompts of scripts/parity_compare.py, runs 100 and up), n_predict 1, and stopped. Writes
OUT_DIR/NAME.perf.data, OUT_DIR/NAME.top.txt (`perf report --sort symbol`, the 30 hottest) and
OUT_DIR/prefill.json (timings.prompt_ms and prompt_n per request). Needs `perf`.
"""
import json, signal, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parity_compare import prefill_prompt  # noqa: E402
from serverproc import model_arguments, parse_model_arguments, post, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = model_arguments(__doc__, runs=5, port=18900)
    ap.add_argument("skippy_args", nargs="*", help="extra skippy-server flags (after --)")
    a = parse_model_arguments(ap)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["-m", a.model, "--host", "127.0.0.1", "-t", str(a.threads), "-c", "4096", "--port", str(a.port)]
    commands = {"llama-server": [str(ROOT / "build/bin/llama-server"), *common, "--parallel", "1", "--no-webui"],
                "skippy-server": [str(ROOT / "build/bin/skippy-server"), *common, "--runtime-lane-count", "1",
                                  *a.skippy_args]}
    result = {"model": a.model, "threads": a.threads, "skippy_args": a.skippy_args, "prefill": {}}
    for name, cmd in commands.items():
        proc = start(cmd, a.port)
        try:
            post(a.port, "/completion", {"prompt": "Warm up.", "n_predict": 1, "cache_prompt": False})
            data = out / f"{name}.perf.data"
            perf = subprocess.Popen(["perf", "record", "-F", "1999", "-p", str(proc.pid), "-o", str(data)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
            samples = []
            for r in range(a.runs):
                t = post(a.port, "/completion", {"prompt": prefill_prompt(100 + r), "n_predict": 1, "temperature": 0,
                                                 "cache_prompt": True})["timings"]
                samples.append({"prompt_n": t["prompt_n"], "prompt_ms": t["prompt_ms"]})
            perf.send_signal(signal.SIGINT)
            perf.wait()
        finally:
            stop(proc)
        result["prefill"][name] = samples
        report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "symbol", "--stdio"],
                                capture_output=True, text=True).stdout
        lines = [l.rstrip() for l in report.splitlines() if l.strip() and not l.startswith("#")]
        (out / f"{name}.top.txt").write_text("\n".join(" ".join(l.split()) for l in lines[:30]) + "\n")
        print(name, [round(s["prompt_ms"], 1) for s in samples], flush=True)
    (out / "prefill.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
