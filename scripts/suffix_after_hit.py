#!/usr/bin/env python3
"""What a short prompt suffix after a prefix hit costs a server, flash attention on and off.

    scripts/suffix_after_hit.py MODEL.gguf OUT.json [--server llama-server|skippy-server]
                                [--runs N] [--threads T] [--port P] [--fa on|off|both]
                                [--server-arg=ARG ...]

Starts build/bin/llama-server (one slot; the default) or build/bin/skippy-server (one lane), with
a 2048-token context, once with `-fa on` and once with `-fa off`, one at a time. Each time: a
~770-token document (cold), then RUNS questions on it whose suffix after the document is ~14
tokens, each a hit (cache_prompt). Writes the server's own timings.prompt_ms / prompt_n per request
(skippy-server's also include the restore, with its `restore_ms` and `cache_tier`) and the
medians. The serving comparisons' llama-server runs `-fa auto`, which is on for the CPU backend,
and its batches under 64 rows then take flash attention's one-row kernel once per row;
skippy-server's batch-invariant kernels take the tiled path from two rows.
"""
import json, statistics, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import model_arguments, parse_model_arguments, post, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = model_arguments(__doc__, runs=5, port=18700)
    ap.add_argument("--server", choices=["llama-server", "skippy-server"], default="llama-server")
    ap.add_argument("--fa", choices=["on", "off", "both"], default="both")
    ap.add_argument("--server-arg", action="append", default=[], help="one more argument for the server")
    a = parse_model_arguments(ap)
    doc = "Doc: " + " ".join(f"w{(i * 7) % 211} x" for i in range(250))
    result = {"model": a.model, "server": a.server, "server_args": a.server_arg, "threads": a.threads,
              "runs": a.runs, "flash_attn": {}}
    for fa in (("on", "off") if a.fa == "both" else (a.fa,)):
        cmd = [str(ROOT / "build/bin" / a.server), "-m", a.model, "--host", "127.0.0.1", "--port", str(a.port),
               "-t", str(a.threads), "-c", "2048", "-fa", fa]
        cmd += ["-np", "1", "--no-webui"] if a.server == "llama-server" else ["--runtime-lane-count", "1"]
        cmd += a.server_arg
        proc = start(cmd, a.port)
        try:
            samples = []
            for q in range(a.runs + 1):
                prompt = f"{doc}\nQuestion {q}: what about w{q * 13} and w{q * 17} in the text above?"
                r = post(a.port, "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0,
                                                 "cache_prompt": True})
                t = r["timings"]
                sample = {"prompt_n": t["prompt_n"], "prompt_ms": t["prompt_ms"]}
                if "skippy" in r:
                    sample.update({k: r["skippy"].get(k) for k in ("cache_tier", "restore_ms")})
                samples.append(sample)
        finally:
            stop(proc)
        hits = samples[1:]
        result["flash_attn"][fa] = {"cold": samples[0], "hits": hits,
                                    "hit_prompt_ms_median": statistics.median(h["prompt_ms"] for h in hits)}
        print(f"{a.server} -fa {fa}: cold {samples[0]['prompt_n']} tokens {samples[0]['prompt_ms']:.1f} ms; "
              f"hit suffix {hits[0]['prompt_n']} tokens, median {result['flash_attn'][fa]['hit_prompt_ms_median']:.1f} ms")
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
