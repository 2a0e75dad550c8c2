#!/usr/bin/env python3
"""Fault trials for skippy-server's disk tier (--cache-dir): crashes and corrupted files never
change an answer and never stop a start.

Kill trials: a server on one cache directory answers a few prompts, then gets SIGKILL at a random
moment (anywhere within a request's duration, or just after one, while the disk tier may still be
writing); the next
trial starts a new server on the same directory. Every answer (greedy token ids and the
log-probabilities of the top 2 tokens at every step) must equal a --no-cache server's, and every
start must succeed.

Corruption trials: with the server stopped, one entry file of the directory is damaged (a flipped
byte anywhere in it, a truncation, a deletion) or a stray file is left in tmp/; the restarted
server is asked the entry's own prompt (its tokens, read from the entry's header, plus 80 new
ones, so the entry is what a lookup finds). The answer must equal --no-cache's, and every damaged
file must be counted in /cache/stats disk.corrupt (a deletion is a plain miss: nothing to count).

    scripts/disk_fault_trials.py --server build/bin/skippy-server --model ZOO/tiny/llama.gguf \
        --kills 100 --corruptions 40 --out docs/evidence/disk-tier/faults-llama.json
"""
import argparse, json, os, random, shutil, signal, struct, subprocess, sys, tempfile, threading, time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverproc  # noqa: E402

# The class pinned: its default (auto) is measured at each start and could differ between the
# restarts and the reference server on a model near the tolerance.
COMMON = ["-c", "1024", "--prefill-chunk", "128", "--runtime-lane-count", "1", "-t", "1", "--host", "127.0.0.1",
          "--one-row-class=off"]


def answer(port, prompt):
    r = serverproc.post(port, "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0, "ignore_eos": True,
                                              "return_tokens": True, "n_probs": 2})
    return {"tokens": r["tokens"], "probs": r["completion_probabilities"]}, r.get("skippy", {})


def entry_tokens(path):
    """The token ids in an entry file's header (format: src/skippy/cache/disk_tier.cc)."""
    with open(path, "rb") as f:
        data = f.read()
    at = 16
    for _ in range(2):  # identity, namespace
        (n,) = struct.unpack_from("<I", data, at)
        at += 4 + n
    at += 2  # kind, exact_only
    (n_tokens,) = struct.unpack_from("<Q", data, at)
    at += 8
    return list(struct.unpack_from(f"<{n_tokens}i", data, at))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--corruptions", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--out", required=True)
    ap.add_argument("--flags", default="", help="more skippy-server flags, space separated")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    extra = a.flags.split()
    ref_port, port = a.port, a.port + 1
    ref = serverproc.start([a.server, "-m", a.model, "--port", str(ref_port), "--no-cache"] + COMMON + extra, ref_port)
    n_vocab = serverproc.get(ref_port, "/v1/models")["data"][0]["meta"]["n_vocab"]
    tok = lambda n: [rng.randrange(1000, min(n_vocab, 20000)) for _ in range(n)]  # noqa: E731
    bases = [tok(rng.randint(150, 300)) for _ in range(4)]
    prompts = [b + tok(rng.randint(5, 60)) for b in bases for _ in range(3)]
    reference = {}

    def expected(prompt):
        key = tuple(prompt)
        if key not in reference:
            reference[key] = answer(ref_port, prompt)[0]
        return reference[key]

    cache_dir = tempfile.mkdtemp(prefix="skippy-disk-faults-")
    cmd = [a.server, "-m", a.model, "--port", str(port), "--cache-dir", cache_dir] + COMMON + extra
    result = {"model": os.path.basename(a.model), "flags": COMMON + extra, "seed": a.seed,
              "kill_trials": 0, "failed_starts": 0, "answers": 0, "wrong_answers": 0, "disk_hits": 0,
              "kill_points": {"during-request": 0, "after-request": 0}, "torn_writes_found": 0,
              "corruption_trials": 0, "corruptions": {}, "corrupt_expected": 0, "corrupt_counted": 0,
              "corruption_wrong_answers": 0, "uncounted": []}

    last_ms = [50.0]  # how long the last answer took: kills during a request land within it

    def check(p, prompt):
        t0 = time.monotonic()
        got, sk = answer(p, prompt)
        last_ms[0] = 1000 * (time.monotonic() - t0)
        result["answers"] += 1
        result["disk_hits"] += 1 if sk.get("cache_tier") == "disk" else 0
        if got != expected(prompt):
            result["wrong_answers"] += 1
            return False
        return True

    def start():
        try:
            return serverproc.start(cmd, port)
        except SystemExit:
            result["failed_starts"] += 1
            return None

    for trial in range(a.kills):
        srv = start()
        if srv is None:
            continue
        result["kill_trials"] += 1
        # What the last kill left: files cut short in tmp/ (torn writes), removed and counted at start.
        result["torn_writes_found"] += serverproc.get(port, "/cache/stats")["disk"]["corrupt"]
        for prompt in rng.sample(prompts, rng.randint(1, 3)):
            check(port, prompt)
        # The kill: while one more request runs, or just after it (the disk tier still writing).
        prompt = rng.choice(prompts) + tok(rng.randint(1, 40))
        during = rng.random() < 0.5
        t = threading.Thread(target=lambda: _swallow(lambda: answer(port, prompt)))
        t.start()
        if during:  # anywhere in the request: prefill, first token, the record, its write
            time.sleep(rng.uniform(0, 1.3 * last_ms[0] / 1000))
        else:
            t.join()
            time.sleep(rng.uniform(0, 0.01))
        result["kill_points"]["during-request" if during else "after-request"] += 1
        srv.send_signal(signal.SIGKILL)
        srv.wait()
        t.join()
    # One clean start after the last kill: everything the trials left must serve exactly.
    srv = start()
    if srv is not None:
        for prompt in prompts:
            check(port, prompt)
        serverproc.stop(srv)

    for trial in range(a.corruptions):
        entries = os.path.join(cache_dir, "entries")
        files = sorted(os.listdir(entries))
        if not files:
            srv = start()
            if srv:
                for prompt in prompts:
                    check(port, prompt)
                serverproc.stop(srv)
            continue
        victim = os.path.join(entries, rng.choice(files))
        op = rng.choice(["flip", "truncate", "delete", "stray-tmp"])
        probe = entry_tokens(victim) + tok(80)
        size = os.path.getsize(victim)
        if op == "flip":
            with open(victim, "r+b") as f:
                at = rng.randrange(size)
                f.seek(at)
                b = f.read(1)[0]
                f.seek(at)
                f.write(bytes([b ^ (1 << rng.randrange(8))]))
        elif op == "truncate":
            os.truncate(victim, rng.randrange(size))
        elif op == "delete":
            os.remove(victim)
        else:
            with open(os.path.join(cache_dir, "tmp", f"stray-{trial}.tmp"), "wb") as f:
                f.write(os.urandom(rng.randint(0, 4096)))
        result["corruptions"][op] = result["corruptions"].get(op, 0) + 1
        counted_expected = 0 if op == "delete" else 1
        srv = start()
        if srv is None:
            continue
        result["corruption_trials"] += 1
        if not check(port, probe):
            result["corruption_wrong_answers"] += 1
        counted = serverproc.get(port, "/cache/stats")["disk"]["corrupt"]
        result["corrupt_expected"] += counted_expected
        result["corrupt_counted"] += counted
        if counted != counted_expected:
            result["uncounted"].append({"trial": trial, "op": op, "counted": counted})
        serverproc.stop(srv)

    serverproc.stop(ref)
    shutil.rmtree(cache_dir, ignore_errors=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    ok = result["wrong_answers"] == 0 and result["failed_starts"] == 0 and not result["uncounted"]
    sys.exit(0 if ok else 1)


def _swallow(fn):
    try:
        fn()
    except Exception:
        pass


if __name__ == "__main__":
    main()
