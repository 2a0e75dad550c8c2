#!/usr/bin/env python3
"""Compares two serve-compare.json runs request by request: prompt tokens reused (cache_n),
prompt tokens prefilled (prompt_n), the generated text and success. Exit 1 if any differ.

Usage: scripts/serve_compare_diff.py BEFORE.json AFTER.json
"""
import json
import sys


def load(path):
    runs = {}
    for r in json.load(open(path))["runs"]:
        key = (r["server"], r["family"], r["workload"], r["repeat"])
        runs[key] = [(q["cache_n"], q["prompt_n"], q["content"], q["ok"]) for q in r["requests"]]
    return runs


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    compared = differ = 0
    for key in sorted(a):
        if key not in b:
            print("only in the first run:", key)
            differ += 1
            continue
        if len(a[key]) != len(b[key]):
            print("request counts differ:", key, len(a[key]), len(b[key]))
            differ += 1
        for i, (x, y) in enumerate(zip(a[key], b[key])):
            compared += 1
            if x != y:
                differ += 1
                print(key, i, "first", x[:2], repr(x[2][:40]), "second", y[:2], repr(y[2][:40]))
    print(f"{compared} requests compared, {differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
