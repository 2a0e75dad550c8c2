"""Helpers the measurement scripts share: their common arguments, start a server process and wait
for /health, POST JSON, run clients at once."""
import argparse, json, subprocess, threading, time, urllib.request
from pathlib import Path


def model_arguments(doc, runs, port):
    """A parser for a measurement script on one model: MODEL, OUT, --runs, --threads, --port; add
    the script's own options, then call parse_model_arguments."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=port)
    return ap


def parse_model_arguments(ap):
    """Parses, and refuses a MODEL that is not a file."""
    a = ap.parse_args()
    if not Path(a.model).is_file():
        ap.error(f"no model at {a.model}")
    return a


def start(cmd, port, env=None, log=None):
    """Starts `cmd` (output to the open file `log`, else discarded; environment `env`, else this
    one's) and returns the process once GET /health answers 200."""
    out = log if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
                            env=env)
    for _ in range(1200):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                return proc
        except Exception:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"server on port {port} did not start: {cmd}")


def get(port, path):
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60).read())


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())


def stop(proc):
    proc.terminate()
    proc.wait()


def rotating_runs(modes, repeats, out_path, launch, measure):
    """Starts each server of `modes` (name -> command) with launch(command), in an order rotated by
    one each repeat, `repeats` times; while it is up, calls measure(name, repeat) for a dict of
    results, then stops it. Writes each run ({"mode", "repeat", **results}) as a JSON line to
    out_path as it ends; returns the runs."""
    runs = []
    with open(out_path, "w") as f:
        for rep in range(repeats):
            names = list(modes)
            names = names[rep % len(names):] + names[:rep % len(names)]
            for name in names:
                server = launch(modes[name])
                try:
                    r = {"mode": name, "repeat": rep, **measure(name, rep)}
                finally:
                    stop(server)
                runs.append(r)
                f.write(json.dumps(r) + "\n")
                f.flush()
    return runs


def at_once(clients, one):
    """Calls one(i) for i in range(clients), each on its own thread, all started together; returns
    the wall seconds until the last returns."""
    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0
