#!/usr/bin/env python3
"""How to store the disk tier's entries: one file each, LMDB, or SQLite, measured on payloads the
size of real entries (a ~2k-token prompt of the bench zoo's llama is ~15 MB).

For each store: write N payloads durably (file: tmp + fdatasync + rename + fsync of the directory;
LMDB: one synced transaction each; SQLite: WAL, synchronous=FULL, one transaction each), read
each back whole, delete half (what a byte cap does), and report MB/s and the bytes the store
holds on disk after the deletes. LMDB comes from PyPI (the `lmdb` package, installed into a venv
under ~/.cache/skippy); SQLite is Python's own.

    scripts/disk_store_choice.py --dir /path/on/the/disk --payload-mib 15 --count 24 \
        --out docs/evidence/disk-tier/store-choice.json
"""
import argparse, json, os, shutil, sqlite3, subprocess, sys, time

VENV = os.path.expanduser("~/.cache/skippy/venv-disk-store-choice")


def ensure_lmdb():
    try:
        import lmdb  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "lmdb==1.4.1"], check=True)
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(py, [py] + sys.argv)


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


def files_store(d, payloads):
    os.makedirs(os.path.join(d, "tmp"))
    os.makedirs(os.path.join(d, "entries"))
    t0 = time.perf_counter()
    for i, p in enumerate(payloads):
        tmp, final = os.path.join(d, "tmp", f"{i}.tmp"), os.path.join(d, "entries", f"{i}.skc")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, p)
        os.fdatasync(fd)
        os.close(fd)
        os.rename(tmp, final)
        dfd = os.open(os.path.join(d, "entries"), os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(len(payloads)):
        with open(os.path.join(d, "entries", f"{i}.skc"), "rb", buffering=0) as f:
            assert len(f.read()) == len(payloads[i])
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(0, len(payloads), 2):
        os.remove(os.path.join(d, "entries", f"{i}.skc"))
    delete_s = time.perf_counter() - t0
    return write_s, read_s, delete_s


def lmdb_store(d, payloads):
    import lmdb
    env = lmdb.open(d, map_size=4 << 30, sync=True, metasync=True, readahead=True)
    t0 = time.perf_counter()
    for i, p in enumerate(payloads):
        with env.begin(write=True) as txn:
            txn.put(str(i).encode(), p)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with env.begin() as txn:
        for i in range(len(payloads)):
            assert len(bytes(txn.get(str(i).encode()))) == len(payloads[i])
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(0, len(payloads), 2):
        with env.begin(write=True) as txn:
            txn.delete(str(i).encode())
    delete_s = time.perf_counter() - t0
    env.close()
    return write_s, read_s, delete_s


def sqlite_store(d, payloads):
    os.makedirs(d)
    db = sqlite3.connect(os.path.join(d, "cache.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE e (k INTEGER PRIMARY KEY, v BLOB)")
    t0 = time.perf_counter()
    for i, p in enumerate(payloads):
        db.execute("BEGIN")
        db.execute("INSERT INTO e VALUES (?, ?)", (i, p))
        db.execute("COMMIT")
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(len(payloads)):
        (v,) = db.execute("SELECT v FROM e WHERE k = ?", (i,)).fetchone()
        assert len(v) == len(payloads[i])
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(0, len(payloads), 2):
        db.execute("BEGIN")
        db.execute("DELETE FROM e WHERE k = ?", (i,))
        db.execute("COMMIT")
    delete_s = time.perf_counter() - t0
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return write_s, read_s, delete_s


def main():
    ensure_lmdb()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/skippy/disk-store-choice"))
    ap.add_argument("--payload-mib", type=float, default=15)
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    n = int(a.payload_mib * (1 << 20))
    payloads = [os.urandom(n) for _ in range(a.count)]
    mb = n * a.count / 1e6
    results = {}
    for rep in range(a.repeats):
        for name, fn in (("files", files_store), ("lmdb", lmdb_store), ("sqlite", sqlite_store)):
            d = os.path.join(a.dir, name)
            shutil.rmtree(d, ignore_errors=True)
            w, r, x = fn(d, payloads)
            results.setdefault(name, []).append({"write_MBps": mb / w, "read_MBps": mb / r,
                                                 "delete_half_ms": 1000 * x, "bytes_on_disk_after_deleting_half": du(d)})
            shutil.rmtree(d, ignore_errors=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    summary = {name: {k: med([r[k] for r in runs]) for k in runs[0]} for name, runs in results.items()}
    doc = {"payload_bytes": n, "count": a.count, "repeats": a.repeats, "dir": a.dir,
           "live_bytes_after_deleting_half": n * (a.count // 2), "median": summary, "runs": results}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
