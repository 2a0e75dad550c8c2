#!/usr/bin/env python3
"""Greedy outputs of skippy-server and a stock llama-server, side by side, on one real model.

    scripts/greedy_side_by_side.py MODEL.gguf OUT.json [--chat] [--flash-attn on|off] [--max-tokens N]
                                   [--port P (and P+1)]

Starts build/bin/skippy-server (cache on) and build/bin/llama-server (stock) on MODEL with 2 threads,
one lane/slot and the same flash-attention setting (default on: skippy-server's default, and what
llama-server's -fa auto picks on CPU), one at a time. Each prompt (chat messages rendered by each
server's own /apply-template with --chat, else plain text) goes to /completion with temperature 0,
`return_tokens` and N generated tokens: twice to skippy-server (cold, then a cache hit) and once to
llama-server. The JSON has, per prompt, the prompt, each server's text and token ids, and whether
they are equal. Exit 0 even when outputs differ (the JSON says so); 2 on bad arguments.
"""
import argparse, json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import post, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = ("You are a concise assistant for a small public library. The library opens at nine and closes at six "
          "on weekdays, and closes at one on Saturday. Books are lent for three weeks, films for one week.")
CHAT = [
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "When does the library close on Saturday?"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How long can I keep a film?"}],
    [{"role": "user", "content": "Write one sentence about the sea."}],
    [{"role": "user", "content": "What is the capital of France?"}],
]
TEXT = [
    "The history of the printing press begins in Mainz, where",
    "A good cup of tea needs",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colours are",
]


def run(cmd, port, prompts, chat, n, repeats):
    proc = start(cmd, port)
    try:
        out = []
        for p in prompts:
            text = post(port, "/apply-template", {"messages": p})["prompt"] if chat else p
            runs = []
            for _ in range(repeats):
                r = post(port, "/completion", {"prompt": text, "n_predict": n, "temperature": 0, "return_tokens": True,
                                               "cache_prompt": True})
                runs.append({"text": r["content"], "tokens": r["tokens"],
                             "tokens_cached": r.get("tokens_cached", r.get("timings", {}).get("cache_n"))})
            out.append({"rendered_prompt": text, "runs": runs})
        return out
    finally:
        stop(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--chat", action="store_true", help="chat prompts through each server's template")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on")
    ap.add_argument("--port", type=int, default=18790)
    a = ap.parse_args()
    if not Path(a.model).is_file():
        ap.error(f"no model at {a.model}")
    prompts = CHAT if a.chat else TEXT
    common = ["-m", a.model, "--host", "127.0.0.1", "-t", "2", "-c", "2048", "-fa", a.flash_attn]
    # Two ports: the first server's closed connections leave the port in TIME_WAIT for a while.
    skippy = run([str(ROOT / "build/bin/skippy-server"), *common, "--port", str(a.port), "--runtime-lane-count", "1"],
                 a.port, prompts, a.chat, a.max_tokens, 2)
    llama = run([str(ROOT / "build/bin/llama-server"), *common, "--port", str(a.port + 1), "--parallel", "1"],
                a.port + 1, prompts, a.chat, a.max_tokens, 1)
    rows = []
    for p, s, l in zip(prompts, skippy, llama):
        ref = l["runs"][0]
        rows.append({
            "prompt": p,
            "same_rendered_prompt": s["rendered_prompt"] == l["rendered_prompt"],
            "llama_server": ref,
            "skippy_cold": s["runs"][0],
            "skippy_hit": s["runs"][1],
            "equal_tokens": s["runs"][0]["tokens"] == ref["tokens"] == s["runs"][1]["tokens"],
        })
    doc = {"model": a.model, "chat": a.chat, "flash_attn": a.flash_attn, "max_tokens": a.max_tokens, "temperature": 0,
           "rows": rows,
           "all_equal": all(r["equal_tokens"] for r in rows)}
    Path(a.out).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    for r in rows:
        print(f"{'=' if r['equal_tokens'] else '!'} {json.dumps(r['skippy_hit']['text'])[:100]}")
    print(f"all equal: {doc['all_equal']}")


if __name__ == "__main__":
    main()
