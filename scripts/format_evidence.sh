#!/usr/bin/env bash
# Exactness on the weight formats people run: the bench zoo in F16, Q8_0, Q4_0, Q4_K_M and each
# family's ref format (made with the pinned llama-quantize by skippy-zoo), certified with
#   skippy-correctness batch-split, flash attention off and on (batch-invariant kernels, the default),
#   skippy-correctness --no-batch-invariant batch-split, flash attention off (llama.cpp's stock kernels),
#   skippy-correctness state-handoff (the family's production payload, flash attention on).
# Writes one JSON per run and summary.md into OUT (default docs/evidence/formats).
#
#   scripts/format_evidence.sh [OUT] [FAMILY ...]    (after the test or main command built the tools)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/evidence/formats}"
shift || true
CACHE_DIR="${SKIPPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/skippy}"
ZOO="$CACHE_DIR/zoo/bench"
BIN=build/bin
for b in skippy-zoo skippy-correctness; do
  [[ -x "$BIN/$b" ]] || { echo "missing $BIN/$b: build first" >&2; exit 2; }
done
families=("$@")
[[ ${#families[@]} -gt 0 ]] || families=(qwen3next falcon-h1 llama qwen3 deepseek2 glm47-flash glm4 gemma4-a4b gemma4-e4b gemma3 gemma2 olmo minimax-m27 deepseek3)
mkdir -p "$OUT"
zoo_args=()
for f in "${families[@]}"; do zoo_args+=(--family "$f"); done
# A format llama-quantize cannot make for a model is a row that says so, not a stopped run.
"$BIN/skippy-zoo" --preset bench --out "$ZOO" "${zoo_args[@]}" --format Q8_0 --format Q4_0 --format Q4_K_M --format ref >&2 ||
  echo "[formats] skippy-zoo could not make every file; those rows say so" >&2

prompt="Certify this prefix on quantized weights: the cache keeps the state of a shared system prompt and restores it exactly."
{
  echo "# Exactness by weight format (bench zoo, synthetic weights)"
  echo
  echo "Command: \`scripts/format_evidence.sh\` at $(git rev-parse --short HEAD) on $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)."
  echo "batch-split: do the fixed and drawn cuts of one prompt (every batch 2+ rows) give byte-identical logits?"
  echo "state-handoff: is the continuation after a restore of the production payload bit-identical to a recompute?"
  echo
  echo "| Family | Format | batch-split fa off | batch-split fa on | stock kernels, fa off | state-handoff |"
  echo "|---|---|---|---|---|---|"
} > "$OUT/summary.md"
verdict() {  # exit code -> cell
  case $1 in
    0) echo "pass" ;;
    1) echo "**differ**" ;;
    3) echo "disabled" ;;
    *) echo "error (exit $1)" ;;
  esac
}
run() {  # json-name args... -> cell
  local name=$1 rc=0; shift
  "$BIN/skippy-correctness" "$@" --report-out "$OUT/$name.json" 2>/dev/null || rc=$?
  verdict "$rc"
}
for f in "${families[@]}"; do
  ref=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['families'][sys.argv[2]]['ref_format'])" "$ZOO/manifest.json" "$f")
  for fmt in F16 Q8_0 Q4_0 Q4_K_M ref; do
    label=$fmt
    if [[ $fmt == ref ]]; then
      label="ref ($ref)"
      case $ref in F16|Q8_0|Q4_0|Q4_K_M) echo "| $f | $label | as $ref above | | | |" >> "$OUT/summary.md"; continue ;; esac
      fmt=$ref
    fi
    model="$ZOO/$f.gguf"
    [[ $fmt == F16 ]] || model="$ZOO/$f.$fmt.gguf"
    if [[ ! -f $model ]]; then
      why=$(grep -m1 -o 'failed to quantize: .*' "$model.log" 2>/dev/null | cut -c20- | tr '|' '/')
      echo "| $f | $label | not made by llama-quantize: ${why:-see $model.log} | | | |" >> "$OUT/summary.md"
      continue
    fi
    a=$(run "$f.$fmt.off" batch-split --model "$model" --flash-attn off)
    b=$(run "$f.$fmt.on" batch-split --model "$model" --flash-attn on)
    c=$(run "$f.$fmt.stock-off" --no-batch-invariant batch-split --model "$model" --flash-attn off)
    d=$(run "$f.$fmt.handoff" state-handoff --model "$model" --prompt "$prompt" --cache-hit-repeats 2)
    echo "| $f | $label | $a | $b | $c | $d |" >> "$OUT/summary.md"
    echo "[formats] $f $label: off $a, on $b, stock off $c, handoff $d" >&2
  done
done
