"""Helpers the measurement scripts share: start a server process and wait for /health, POST JSON."""
import json, subprocess, time, urllib.request


def start(cmd, port):
    """Starts `cmd` (output discarded) and returns the process once GET /health answers 200."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
