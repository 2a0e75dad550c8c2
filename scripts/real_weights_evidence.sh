#!/usr/bin/env bash
# The evidence on real weights (docs/evidence/real-weights/), for every model of
# evals/real-models.json that can be fetched:
#   certify/   skippy-correctness state-handoff and batch-split, flash attention on and off, with the
#              batch-invariant kernels and (batch-split) without them (--no-batch-invariant)
#   family-bench/  the main command on them (SKIPPY_REAL_WEIGHTS=1): family rows and use cases
#   serve-compare/ skippy-server vs llama-server (defaults, and matched settings), one client
#   greedy/    greedy outputs side by side with llama-server's (scripts/greedy_side_by_side.py)
#
#   scripts/real_weights_evidence.sh OUT [STEP ...]     STEP: certify family-bench serve-compare greedy
#
# Needs a built tree (scripts/test.sh or the main command). One step after another: the timings
# assume an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/real_weights_evidence.sh OUT [certify|family-bench|serve-compare|greedy ...]}
shift
steps=${*:-certify family-bench serve-compare greedy}
mkdir -p "$out"
cache=${SKIPPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/skippy}
dir="$cache/real-weights"
python3 evals/real_models.py fetch --dir "$dir"
# name family chat|text, one line per fetched model
fetched=$(python3 evals/real_models.py fetched --dir "$dir")
[ -n "$fetched" ] || { echo "no real model could be fetched: nothing to measure" >&2; exit 0; }
names=$(awk '{print $1}' <<<"$fetched")
families=$(awk '{print $2}' <<<"$fetched")

for step in $steps; do
  case $step in
    certify)
      mkdir -p "$out/certify"
      for name in $names; do
        for fa in on off; do
          build/bin/skippy-correctness state-handoff --model "$dir/$name.gguf" --flash-attn "$fa" \
            --prompt "The history of the printing press begins in Mainz, where" \
            --report-out "$out/certify/$name.state-handoff.fa-$fa.json" >/dev/null ||
            echo "FAILED: $name state-handoff, flash attention $fa (see the JSON)" >&2
          build/bin/skippy-correctness batch-split --model "$dir/$name.gguf" --flash-attn "$fa" \
            --report-out "$out/certify/$name.batch-split.fa-$fa.json" >/dev/null ||
            echo "FAILED: $name batch-split, flash attention $fa (see the JSON)" >&2
          build/bin/skippy-correctness --no-batch-invariant batch-split --model "$dir/$name.gguf" --flash-attn "$fa" \
            --report-out "$out/certify/$name.batch-split.stock-kernels.fa-$fa.json" >/dev/null ||
            [ $? -eq 1 ]  # a mismatch on the stock kernels is a finding, not a failed run
        done
      done ;;
    family-bench)
      SKIPPY_REAL_WEIGHTS=1 SKIPPY_CACHE_SKIP_BUILD=1 evals/skippy-cache-family-bench.sh "$out/family-bench" ;;
    serve-compare)
      cases=()
      for f in $families; do cases+=(--case "$f"); done
      # The settings of the README's ref-format table (flash attention on: skippy-server's default
      # with the batch-invariant kernels; llama-server's default -fa auto is on for CPU too).
      build/bin/skippy-bench serve-compare --output-dir "$out/serve-compare" "${cases[@]}" \
        --model-dir "$dir/by-family" --lanes 1 --threads 2 --ctx-size 2048 --repeats 2 --long-prefix-words 400 \
        --requests 6 --documents 8 --rounds 3 --conversations 3 --turns 3 --agent-steps 5 --n-predict 8 \
        --ttft-slo-ms 500 --flash-attn on ;;
    greedy)
      mkdir -p "$out/greedy"
      while read -r name _ kind; do
        flag=()
        [ "$kind" = chat ] && flag=(--chat)
        for fa in on off; do
          python3 scripts/greedy_side_by_side.py "$dir/$name.gguf" "$out/greedy/$name.fa-$fa.json" "${flag[@]}" \
            --flash-attn "$fa"
        done
      done <<<"$fetched" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
