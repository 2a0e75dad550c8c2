#!/usr/bin/env bash
# Batch-size classes on the bench zoo: for every family, flash attention on and off, runs
#   skippy-correctness batch-split  with the runtime's rule (64 on / 2 off): must pass, and
#   skippy-correctness batch-split --min-batch 1 (on: also --min-batch 2): shows the line exists.
# Writes one JSON per run and summary.md into OUT (default docs/evidence/batch-split).
#
#   scripts/batch_split_evidence.sh [OUT]    (after the main command built the tools and the zoo)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/evidence/batch-split}"
CACHE_DIR="${SKIPPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/skippy}"
ZOO="$CACHE_DIR/zoo/bench"
BIN=build/bin/skippy-correctness
[[ -x "$BIN" ]] || { echo "missing $BIN: build first" >&2; exit 2; }
mkdir -p "$OUT"
families=(llama qwen3 glm4 olmo gemma2 gemma3 gemma4-a4b gemma4-e4b deepseek2 deepseek3 glm47-flash minimax-m27 qwen3next falcon-h1)
{
  echo "# Batch-size classes (bench zoo, synthetic weights)"
  echo
  echo "Command: \`scripts/batch_split_evidence.sh\` on $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)."
  echo "Each cell: do five cuts of the same prompt, every batch at least N rows, give byte-identical logits?"
  echo
  echo "| Family | fa off, N=2 (rule) | fa off, N=1 | fa on, N=64 (rule) | fa on, N=2 |"
  echo "|---|---|---|---|---|"
} > "$OUT/summary.md"
cell() {  # family tag flags... -> equal / differ / error
  local fam="$1" tag="$2"; shift 2
  local rc=0
  "$BIN" batch-split --model "$ZOO/$fam.gguf" "$@" --report-out "$OUT/$fam.$tag.json" 2>/dev/null || rc=$?
  case $rc in
    0) echo "equal" ;;
    1) echo "**differ**" ;;
    *) echo "error (exit $rc)" ;;
  esac
}
for f in "${families[@]}"; do
  a=$(cell "$f" off-rule --flash-attn off)
  b=$(cell "$f" off-1 --flash-attn off --min-batch 1)
  c=$(cell "$f" on-rule --flash-attn on)
  d=$(cell "$f" on-2 --flash-attn on --min-batch 2)
  echo "| $f | $a | $b | $c | $d |" >> "$OUT/summary.md"
  echo "[batch-split] $f: off/2 $a, off/1 $b, on/64 $c, on/2 $d" >&2
done
