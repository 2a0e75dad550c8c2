#!/usr/bin/env bash
# Time to first token, skippy-server vs llama-server on one model, one server at a time:
# scripts/ttft.py (cold, prefix hit, exact repeat; median of RUNS) against each server in turn,
# ROUNDS times. Servers: skippy-server with its defaults, skippy-server --no-batch-invariant
# (llama.cpp's stock kernels), and the stock llama-server with its defaults; all with 2 threads,
# a 2048-token context and one slot. Prints one JSON line per server and round.
#
#   scripts/ttft_compare.sh MODEL.gguf [ROUNDS] [RUNS] [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1 rounds=${2:-2} runs=${3:-5} base_port=${4:-18670}
port=$base_port
wait_healthy() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server on $port did not start" >&2
  return 1
}
measure() {  # name, command... (its --port is $port; each server gets the next port)
  local name=$1; shift
  "$@" >/dev/null 2>&1 &
  local pid=$!
  wait_healthy
  python3 scripts/ttft.py "$port" "$runs" | python3 -c "import json,sys; d=json.load(sys.stdin); d.update(server=sys.argv[1], model=sys.argv[2], round=int(sys.argv[3])); print(json.dumps(d))" "$name" "$model" "$r"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  port=$((port + 1))
}
for r in $(seq "$rounds"); do
  measure skippy build/bin/skippy-server -m "$model" --port $port -t 2 -c 2048 --parallel 1
  measure skippy-stock-kernels build/bin/skippy-server -m "$model" --port $port -t 2 -c 2048 --parallel 1 --no-batch-invariant
  measure llama-server build/bin/llama-server -m "$model" --port $port -t 2 -c 2048 --parallel 1 --no-webui
done
