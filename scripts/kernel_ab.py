#!/usr/bin/env python3
"""skippy-server on two builds of llama.cpp's libraries, same model, alternating starts.

    scripts/kernel_ab.py MODEL.gguf OUT.json LIBDIR_A LIBDIR_B [--rounds N] [--runs R] [--port P]
                         [--server-arg=ARG ...]

For a change to the patch series: LIBDIR_A and LIBDIR_B are two bin/ folders of the bootstrap's
patched llama.cpp builds (~/.cache/skippy/llama.cpp/build-...-patched-DIGEST/bin), put first on
LD_LIBRARY_PATH so that build/bin/skippy-server loads them instead of the ones it was linked
with. Each round starts the server on A, then on B (2 threads, 2048-token context, one lane, its
defaults: the cache on, --one-row-class=auto, or what --server-arg adds, such as
--server-arg=--one-row-class=on to compare the bits of both sides in the class), and per start records
- whether the one-row class was on (`/cache/stats`);
- the startup measure of a lone decode step in the one-row class and without it (from its log);
- over RUNS new prompts (scripts/ttft.py's: 14 sentences and a question), the medians of the
  cold prefill, the prefill after a restored prefix (a second question on the same prompt) and
  the decode time per token, from each answer's timings;
- a SHA-256 of the top-4 log-probabilities of a fixed prompt's 16 greedy tokens, which must be the
  same on A and B where the change is meant to keep every bit (same_bits compares starts of both
  sides that ran in the same class; null when no class had starts of both).
Prints and writes JSON: the starts, and per side the medians over rounds.
"""
import argparse, hashlib, json, os, re, statistics, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import get, post, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PREFIX = " ".join(f"Section {i}: the cache keeps exact state for shared prefixes." for i in range(14))
LONE_STEP = re.compile(r"takes ([0-9.]+) ms in the one-row class and ([0-9.]+) ms without it .*? is ([0-9.]+)x")


def one_start(model, libdir, port, runs, server_args):
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [str(ROOT / "build/bin/skippy-server"), "-m", model, "--port", str(port), "-t", "2", "-c", "2048",
           "--parallel", "1", *server_args]
    proc = start(cmd, port, env=env, log=log)
    try:
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        if f"{libdir}/libggml-cpu.so" not in maps:
            raise SystemExit(f"skippy-server did not load libggml-cpu.so from {libdir}")
        cold, hit, decode = [], [], []
        for r in range(runs):
            prompt = f"Run {r} of {time.time_ns()}. " + PREFIX
            body = {"n_predict": 16, "temperature": 0, "cache_prompt": True}
            a = post(port, "/completion", dict(body, prompt=prompt + " Question A?"))
            b = post(port, "/completion", dict(body, prompt=prompt + " Question B, different?"))
            cold.append(a["timings"]["prompt_ms"])
            hit.append(b["timings"]["prompt_ms"])
            decode.append(a["timings"]["predicted_ms"] / a["timings"]["predicted_n"])
        fixed = post(port, "/completion", {"prompt": "A fixed prompt for comparing bits. " + PREFIX, "n_predict": 16,
                                           "temperature": 0, "n_probs": 4, "cache_prompt": False})
        one_row_class = get(port, "/cache/stats")["one_row_class"]["on"]
        probs = hashlib.sha256(json.dumps(fixed["completion_probabilities"], sort_keys=True).encode()).hexdigest()
    finally:
        stop(proc)
    log.seek(0)
    m = LONE_STEP.search(log.read())
    os.unlink(log.name)
    return {"libdir": str(libdir), "lone_step_class_ms": float(m.group(1)) if m else None,
            "lone_step_default_ms": float(m.group(2)) if m else None, "lone_step_ratio": float(m.group(3)) if m else None,
            "cold_prefill_ms": statistics.median(cold), "hit_prefill_ms": statistics.median(hit),
            "decode_ms_per_token": statistics.median(decode), "one_row_class": one_row_class, "probs_sha256": probs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("lib_a")
    ap.add_argument("lib_b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--port", type=int, default=18730)
    ap.add_argument("--server-arg", action="append", default=[], help="one more skippy-server argument (repeatable)")
    a = ap.parse_args()
    libs = {"a": Path(a.lib_a).resolve(), "b": Path(a.lib_b).resolve()}
    for side, d in libs.items():
        if not (d / "libggml-cpu.so").exists():
            ap.error(f"no libggml-cpu.so in {d} ({side})")
    starts = []
    for r in range(a.rounds):
        for side in ("a", "b"):
            s = one_start(a.model, libs[side], a.port, a.runs, a.server_arg)
            s.update(side=side, round=r)
            starts.append(s)
            print(json.dumps(s), file=sys.stderr)
    summary = {}
    for side in ("a", "b"):
        mine = [s for s in starts if s["side"] == side]
        summary[side] = {k: (statistics.median(v) if (v := [s[k] for s in mine if s[k] is not None]) else None)
                         for k in ("lone_step_class_ms", "lone_step_default_ms", "lone_step_ratio", "cold_prefill_ms",
                                   "hit_prefill_ms", "decode_ms_per_token")}
        summary[side]["libdir"] = str(libs[side])
    # The class is in the bits: compare starts that ran in the same one, and only where both sides
    # have starts in it (how many each had is in "starts_per_class").
    groups = {on: [s for s in starts if s["one_row_class"] == on] for on in (False, True)}
    summary["starts_per_class"] = {("on" if on else "off"): {side: sum(s["side"] == side for s in g) for side in "ab"}
                                   for on, g in groups.items()}
    compared = [g for g in groups.values() if {s["side"] for s in g} == {"a", "b"}]
    summary["same_bits"] = (all(len({s["probs_sha256"] for s in g}) == 1 for g in compared) if compared else None)
    out = {"model": a.model, "rounds": a.rounds, "runs": a.runs, "server_args": a.server_arg, "starts": starts,
           "summary": summary}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
