#!/usr/bin/env bash
# Coverage-guided fuzzing of skippy's input parsers with libFuzzer (AddressSanitizer and
# UndefinedBehaviorSanitizer on): request bodies (fuzz/request_fuzz.cc), chat requests through
# the template and tokenizer (fuzz/chat_fuzz.cc), sequence-state bytes (fuzz/state_fuzz.cc),
# damaged disk tier entry files (fuzz/disk_entry_fuzz.cc) and GGUF files (fuzz/gguf_fuzz.cc).
# Installs clang and its runtime from Debian if missing, builds the whole
# tree with clang into build-fuzz/ (llama.cpp itself is the cached GCC build, not instrumented),
# then runs each target for SECONDS (default 600). New inputs go to build-fuzz/new-corpus/TARGET;
# crashes to build-fuzz/crashes/TARGET/ and the script exits non-zero. Copy inputs worth keeping
# into fuzz/corpus/TARGET: the test suite replays that corpus (label fuzz).
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET ...]     (targets: request chat state disk_entry gguf;
#                                                    default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(request chat state disk_entry gguf)

bootstrap_env=$(SKIPPY_APT_EXTRA="clang-14 libclang-rt-14-dev" scripts/bootstrap.sh)  # keeps its exit status for set -e
eval "$bootstrap_env"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSKIPPY_FUZZ=ON \
  -DLLAMA_CPP_SOURCE_DIR="$LLAMA_CPP_SOURCE_DIR" -DLLAMA_CPP_BUILD_DIR="$LLAMA_CPP_BUILD_DIR" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target $(printf 'skippy-fuzz-%s ' "${targets[@]}")

status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/new-corpus/$t" "build-fuzz/crashes/$t"
  echo "[fuzz] $t for ${seconds}s" >&2
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "build-fuzz/bin/skippy-fuzz-$t" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 \
      -artifact_prefix="build-fuzz/crashes/$t/" -print_final_stats=1 \
      "build-fuzz/new-corpus/$t" "fuzz/corpus/$t" 2> "build-fuzz/fuzz-$t.log"; then
    echo "[fuzz] $t FOUND A FAILURE: build-fuzz/fuzz-$t.log, build-fuzz/crashes/$t/" >&2
    status=1
  fi
  grep -E "^stat::|Done [0-9]+ runs" "build-fuzz/fuzz-$t.log" | sed "s/^/[fuzz] $t: /" >&2 || true
done
exit $status
