#!/usr/bin/env python3
"""Cold prefill and decode speed of skippy-server and a stock llama-server on one model.

    scripts/parity_compare.py MODEL.gguf OUT.json [--runs N] [--threads T] [--port P] [--one-up] [--class-off]

Runs build/bin/skippy-server (one lane, its defaults: flash attention on, batch-invariant kernels)
and build/bin/llama-server (one slot, its defaults: -fa auto) with the same threads and a
4096-token context, alternating between them (which one goes first flips every run; only one
computes at a time):
  - cold prefill: a new 300-word prompt (never seen; the same one for both), n_predict 1:
    timings.prompt_ms;
  - decode: a new prompt of --decode-words words (20 by default: short), 64 tokens with ignore_eos:
    timings.predicted_ms / predicted_n.
With --class-off, a third server runs beside them: skippy-server with --one-row-class=off (the
default kernels' class for a lone row, which auto may have left or not; /cache/stats of the default
one says which). By default all servers stay up side by side for the whole run; before each timed
request the script waits until every skippy-server up has no idle work left (answer prefill starts
50 ms after a request; /cache/stats answers_pending), so it never overlaps another server's request. With --one-up only one server
process exists at a time: each run starts the server, warms it with a short prompt, measures,
and stops it (the decode prompts are chosen first, on llama-server alone, since it refuses some;
samples.*.decode_attempt says which one each server decoded where a refusal moved it on).
Writes every sample, the medians and skippy / llama-server ratios (above 1: skippy is slower).
"""
import json, random, statistics, sys, time, urllib.error
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import get, model_arguments, parse_model_arguments, post, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def completion(port, body):
    return post(port, "/completion", body)["timings"]


def settle(ports):
    """Waits until no skippy-server in `ports` has idle work left (/cache/stats answers_pending),
    so one server's answer prefill never overlaps another's timed request."""
    time.sleep(0.2)  # idle work starts once the server has been idle for 50 ms
    for port in ports:
        for _ in range(200):
            if get(port, "/cache/stats").get("answers_pending", 0) == 0:
                break
            time.sleep(0.05)
        else:
            raise SystemExit(f"the skippy-server on port {port} still has idle work after 10 s")


def prefill_prompt(r):
    rng = random.Random(f"prefill-{r}")  # the same new prompt for both servers in a run
    return f"Run {r}. " + " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(300))


DECODE_WORDS = 20  # --decode-words


def decode_prompt(r, attempt):
    rng = random.Random(f"decode-{r}" + (f"-{attempt}" if attempt else ""))
    return f"Decode run {r}: " + " ".join(rng.choice(WORDS) for _ in range(DECODE_WORDS))


def decode(port, prompt):
    return completion(port, {"prompt": prompt, "n_predict": 64, "temperature": 0, "ignore_eos": True,
                             "cache_prompt": True})


def refused(e):
    # On random weights llama-server sometimes refuses its own output with a 500 ("does not match
    # the expected Content-only format"); then both servers take the next prompt.
    return e.code == 500 and b"does not match the expected" in e.read()


def first_accepted(r, ask, first=0):
    """(attempt, answer) of the first decode prompt of run r, from attempt `first`, that `ask(prompt)`
    gets answered."""
    for attempt in range(first, 10):
        try:
            return attempt, ask(decode_prompt(r, attempt))
        except urllib.error.HTTPError as e:
            if not refused(e):
                raise
    raise SystemExit(f"run {r}: llama-server refused ten decode prompts")


def main():
    ap = model_arguments(__doc__, runs=7, port=18810)
    ap.add_argument("--one-up", action="store_true", help="one server process at a time (see above)")
    ap.add_argument("--class-off", action="store_true", help="also skippy-server --one-row-class=off (see above)")
    ap.add_argument("--decode-words", type=int, default=20,
                    help="words in the decode prompt (20: about 60 tokens; a step's attention grows with them)")
    a = parse_model_arguments(ap)
    global DECODE_WORDS
    DECODE_WORDS = a.decode_words
    ports = {"skippy": a.port, "llama-server": a.port + 1}
    if a.class_off:
        ports["skippy-class-off"] = a.port + 2
    common = ["-m", a.model, "--host", "127.0.0.1", "-t", str(a.threads), "-c", "4096"]
    commands = {"skippy": [str(ROOT / "build/bin/skippy-server"), *common, "--port", str(ports["skippy"]),
                           "--runtime-lane-count", "1"],
                "llama-server": [str(ROOT / "build/bin/llama-server"), *common, "--port", str(ports["llama-server"]),
                                 "--parallel", "1", "--no-webui"]}
    if a.class_off:
        commands["skippy-class-off"] = commands["skippy"][:-4] + ["--port", str(ports["skippy-class-off"]),
                                                                   "--runtime-lane-count", "1", "--one-row-class=off"]
    samples = {k: {"prefill_ms": [], "prefill_tokens": [], "decode_ms_per_token": []} for k in ports}
    skippy_ports = [port for name, port in ports.items() if name.startswith("skippy")]
    procs = {}
    one_row_class = None  # what the default skippy-server's /cache/stats says it decided
    try:
        if a.one_up:
            procs["llama-server"] = start(commands["llama-server"], ports["llama-server"])
            attempts = [first_accepted(r, lambda p: decode(ports["llama-server"], p))[0] for r in range(a.runs)]
            stop(procs.pop("llama-server"))
        else:
            procs = {name: start(cmd, ports[name]) for name, cmd in commands.items()}
            one_row_class = get(ports["skippy"], "/cache/stats").get("one_row_class")
        for r in range(a.runs):
            order = list(ports)[r % len(ports):] + list(ports)[:r % len(ports)]
            t = {}
            for name in order:
                if a.one_up:
                    procs[name] = start(commands[name], ports[name])
                    completion(ports[name], {"prompt": "Warm up.", "n_predict": 1, "cache_prompt": False})
                    if name == "skippy":
                        one_row_class = get(ports[name], "/cache/stats").get("one_row_class") or {}
                        samples[name].setdefault("one_row_class_on", []).append(one_row_class.get("on"))
                if not a.one_up:
                    settle(skippy_ports)
                p = completion(ports[name], {"prompt": prefill_prompt(r), "n_predict": 1, "temperature": 0,
                                             "cache_prompt": True})
                samples[name]["prefill_ms"].append(p["prompt_ms"])
                samples[name]["prefill_tokens"].append(p["prompt_n"])
                if a.one_up:
                    # llama-server may refuse the probed prompt after this run's prefill (its greedy
                    # answer can change with what its cache held); it then takes the next one, and
                    # the sample says which prompt each server decoded.
                    attempt, t[name] = first_accepted(r, lambda p: decode(ports[name], p), attempts[r])
                    samples[name].setdefault("decode_attempt", []).append(attempt)
                    stop(procs.pop(name))
            if not a.one_up:
                def decode_each(prompt):
                    out = {}
                    for name in order:
                        settle(skippy_ports)
                        out[name] = decode(ports[name], prompt)
                    return out
                _, t = first_accepted(r, decode_each)
            for name in order:
                samples[name]["decode_ms_per_token"].append(t[name]["predicted_ms"] / t[name]["predicted_n"])
    finally:
        for p in procs.values():
            stop(p)
    med = {k: {m: statistics.median(v[m]) for m in ("prefill_ms", "decode_ms_per_token")} for k, v in samples.items()}
    ratios = {m: med["skippy"][m] / med["llama-server"][m] for m in ("prefill_ms", "decode_ms_per_token")}
    doc = {"model": a.model, "threads": a.threads, "runs": a.runs, "one_up": a.one_up, "decode_words": a.decode_words,
           "samples": samples, "medians": med,
           "skippy_over_llama_server": ratios, "one_row_class": one_row_class}
    if a.class_off:
        doc["skippy_class_off_over_llama_server"] = {
            m: med["skippy-class-off"][m] / med["llama-server"][m] for m in ("prefill_ms", "decode_ms_per_token")}
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    for k, v in med.items():
        print(f"{k:16} cold prefill {v['prefill_ms']:8.1f} ms   decode {v['decode_ms_per_token']:6.2f} ms/token")
    print(f"skippy (one-row class {'on' if (one_row_class or {}).get('on') else 'off'}) / llama-server: "
          f"prefill {ratios['prefill_ms']:.3f}, decode {ratios['decode_ms_per_token']:.3f}")
    if a.class_off:
        r = doc["skippy_class_off_over_llama_server"]
        print(f"skippy class off / llama-server: prefill {r['prefill_ms']:.3f}, decode {r['decode_ms_per_token']:.3f}")


if __name__ == "__main__":
    main()
