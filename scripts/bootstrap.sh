#!/usr/bin/env bash
# Installs what Skippy needs on a fresh Debian machine, idempotently:
#   1. Debian packages by name (only the ones the build uses);
#   2. llama.cpp from the pinned npm package node-llama-cpp (a git bundle inside it),
#      digest-verified, built once into a cache outside the checkout keyed by version and options.
#   3. Skippy's patch series (patches/llama.cpp) applied to a copy of that tree, whose ggml libraries
#      are built beside the stock build (llama-server and the other tools stay stock).
# Prints the llama.cpp source and build directories as shell assignments on its last two lines
# (LLAMA_CPP_SOURCE_DIR=..., LLAMA_CPP_BUILD_DIR=...) so callers can `eval` them: the patched
# source, and a directory whose bin/ links the stock build with the patched ggml libraries.
#
# Overrides:
#   LLAMA_STAGE_BUILD_DIR   an existing llama.cpp build (with bin/llama-server); no build is done.
#   LLAMA_CPP_SOURCE_DIR    an existing llama.cpp source tree; built as it is (no patch series) into the
#                           cache, keyed by its commit.
#   SKIPPY_CACHE_DIR        where slow artefacts live (default: ${XDG_CACHE_HOME:-~/.cache}/skippy).
#   SKIPPY_SKIP_APT=1       do not touch Debian packages (for machines you manage yourself).
#   SKIPPY_APT_EXTRA        more Debian packages by name, for one tool (scripts/fuzz.sh: clang).
set -euo pipefail

NPM_PACKAGE="node-llama-cpp@3.21.1"
NPM_INTEGRITY="sha512-E3N0Ev2Va0wzydvXYFwM9Hvyo07PoWjt8T/9GMc43Cvt8YkV/NU/tYUgEMC1grTPv2o9PRjQi0G3Wb5P/awiMg=="
LLAMA_COMMIT="80fb11ac73e66d89eae2c6a91d8a77428fa733ed"
LLAMA_TAG="v0.4.0"

CACHE_DIR="${SKIPPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/skippy}"
log() { printf '[bootstrap] %s\n' "$*" >&2; }
die() { printf '[bootstrap] error: %s\n' "$*" >&2; exit 1; }

# --- 1. Debian packages -------------------------------------------------------------------------
# Why each is here (also in README.md, "Dependencies"):
#   cmake, ninja-build, g++        build
#   git                            cloning the llama.cpp bundle
#   nodejs, npm                    fetching the pinned llama.cpp release; the openai client test
#   libgtest-dev, libgmock-dev     unit tests
#   libbenchmark-dev               microbenchmarks
#   nlohmann-json3-dev             JSON reports and HTTP bodies
#   libcli11-dev                   command-line parsing
#   libxxhash-dev                  fast non-cryptographic hashing for the cache index
#   libssl-dev                     SHA-256 for model identity and payload digests
#   libabsl-dev                    absl::Status / StatusOr: errors as values across the project
#   libfmt-dev                     string formatting (messages, keys, tables)
#   gnuplot-nox                    PNG charts in the benchmark report
#   curl                           health checks in shell scripts
#   libhiredis-dev                 Redis client for the shared cache tier (a fleet's replicas)
#   redis-server                   the shared tier's store, started by the tests and benchmarks
APT_PACKAGES=(cmake ninja-build g++ git libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev libssl-dev libabsl-dev libfmt-dev gnuplot-nox curl
  libhiredis-dev redis-server)
# shellcheck disable=SC2206  # a list of package names, split on spaces on purpose
[ -n "${SKIPPY_APT_EXTRA:-}" ] && APT_PACKAGES+=(${SKIPPY_APT_EXTRA})

install_apt() {
  [ "${SKIPPY_SKIP_APT:-0}" = 1 ] && return 0
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  # Node.js may come from elsewhere (nodesource ships npm inside its nodejs); only ask Debian when
  # the commands are missing.
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# --- 2. llama.cpp ---------------------------------------------------------------------------------
# Build options are part of the cache key: changing them builds a new tree beside the old one.
cpu_key() { grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-8; }
LLAMA_CMAKE_OPTS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_RPC=ON
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CCACHE=OFF)
# Without llama.cpp's AMX kernels. On a CPU with AMX-INT8 (Sapphire Rapids and later), -march=native
# compiles in ggml-cpu/amx, which takes Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS weights; there the first
# product of a Q4_K_M model segfaults at the kernel's tile-config load (llama-server and Skippy
# alike, on the machines this project runs on; upstream: "segfault in ggml_backend_amx_mul_mat"),
# and Skippy's batch-invariance patches and proofs do not cover those kernels. -U cancels the
# compiler's feature macros that guard that code, so the rest of -march=native stays as it is.
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
  LLAMA_CMAKE_OPTS+=("-DCMAKE_C_FLAGS=-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__"
    "-DCMAKE_CXX_FLAGS=-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__")
fi
LLAMA_TARGETS=(llama llama-server ggml-rpc-server llama-quantize llama-imatrix)
# The files a complete build must have; their digests are recorded in the stamp and re-checked.
LLAMA_OUTPUTS=(bin/libllama.so bin/libggml.so bin/libggml-base.so bin/libggml-cpu.so bin/libggml-rpc.so
  bin/llama-server bin/ggml-rpc-server bin/llama-quantize bin/llama-imatrix)

# Skippy's patch series on the pinned tree (patches/llama.cpp/*.patch, applied in name order). Only
# the libraries Skippy links (libllama and ggml) are built from the patched tree; llama-server,
# llama-quantize and the other tools stay the stock build, so every baseline is a stock
# llama-server. Each kernel patch is off until Skippy switches it on at run time; the cpp-httplib
# patch needs no switch (only Skippy compiles that copy).
PATCH_DIR="$(cd "$(dirname "$0")/.." && pwd)/patches/llama.cpp"
PATCHED_TARGETS=(llama ggml-rpc)
PATCHED_OUTPUTS=(bin/libllama.so bin/libggml.so bin/libggml-base.so bin/libggml-cpu.so bin/libggml-rpc.so)

stamp_body() { # $1 = build dir, $2 = name of the outputs array
  local -n outs=$2
  local f
  for f in "${outs[@]}"; do
    [ -f "$1/$f" ] || return 1
    printf '%s  %s\n' "$(sha256sum "$1/$f" | cut -d' ' -f1)" "$f"
  done
}

build_is_complete() { # $1 = build dir, $2 = name of the outputs array
  [ -f "$1/.skippy-complete" ] || return 1
  local now
  now=$(stamp_body "$1" "$2") || return 1
  [ "$now" = "$(cat "$1/.skippy-complete")" ]
}

fetch_source() { # $1 = destination source dir
  local dst=$1 tmp
  tmp=$(mktemp -d)
  log "fetching $NPM_PACKAGE from the npm registry"
  (cd "$tmp" && npm pack "$NPM_PACKAGE" --silent >/dev/null) || die "npm pack $NPM_PACKAGE failed"
  local tgz got
  tgz=$(ls "$tmp"/*.tgz)
  got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
  [ "$got" = "$NPM_INTEGRITY" ] || die "digest mismatch for $NPM_PACKAGE: got $got"
  tar -xzf "$tgz" -C "$tmp" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  grep -q "\"$LLAMA_TAG\"" "$tmp/package/llama/llama.cpp.info.json" || die "unexpected llama.cpp tag in $NPM_PACKAGE"
  rm -rf "$dst.partial"
  git clone -q "$tmp/package/llama/gitRelease.bundle" "$dst.partial" >&2
  git -C "$dst.partial" -c advice.detachedHead=false checkout -q "$LLAMA_COMMIT" >&2
  [ "$(git -C "$dst.partial" rev-parse HEAD)" = "$LLAMA_COMMIT" ] || die "bundle does not hold $LLAMA_COMMIT"
  rm -rf "$dst" && mv "$dst.partial" "$dst"
  rm -rf "$tmp"
}

patch_series() { ls "$PATCH_DIR"/*.patch 2>/dev/null | sort; }
patch_digest() { # digest of the series: names and contents, in order
  local f
  for f in $(patch_series); do printf '%s\n' "$(basename "$f")"; cat "$f"; done | sha256sum | cut -c1-12
}

make_patched_source() { # $1 = pinned source dir, $2 = destination
  local src=$1 dst=$2 f
  log "applying $(patch_series | wc -l) patch(es) from patches/llama.cpp to a copy of the pinned tree"
  rm -rf "$dst.partial"
  git clone -q --no-checkout "$src" "$dst.partial" >&2
  git -C "$dst.partial" -c advice.detachedHead=false checkout -q "$LLAMA_COMMIT" >&2
  for f in $(patch_series); do
    git -C "$dst.partial" apply --whitespace=nowarn "$f" >&2 || die "patch $(basename "$f") does not apply to $LLAMA_COMMIT"
  done
  patch_digest > "$dst.partial/.skippy-patches"
  rm -rf "$dst" && mv "$dst.partial" "$dst"
}

build_llama() { # $1 = source dir, $2 = build dir, $3 = targets array name, $4 = outputs array name
  local src=$1 bld=$2 jobs
  local -n tgts=$3
  jobs=$(nproc)
  log "building llama.cpp ($(basename "$bld"): ${tgts[*]}) with $jobs jobs; this takes several minutes once"
  rm -rf "$bld"
  cmake -S "$src" -B "$bld" -G Ninja "${LLAMA_CMAKE_OPTS[@]}" >&2
  cmake --build "$bld" -j "$jobs" --target "${tgts[@]}" >&2
  stamp_body "$bld" "$4" > "$bld/.skippy-complete.tmp" || die "llama.cpp build $bld is missing outputs"
  mv "$bld/.skippy-complete.tmp" "$bld/.skippy-complete"
}

ensure_build() { # $1 = source dir, $2 = build dir, $3 = targets array name, $4 = outputs array name
  # One builder at a time per cache entry; a second caller waits and then reuses the result.
  exec 9>"$2.lock"
  flock 9
  if build_is_complete "$2" "$4"; then
    log "reusing cached llama.cpp build $2"
  else
    [ -d "$2" ] && log "cached llama.cpp build $2 is incomplete or corrupt; rebuilding"
    build_llama "$@"
  fi
  flock -u 9
}

# The directory Skippy links against: bin/ holds a link to every file of the stock build, except
# libllama and the ggml libraries, which link to the patched build (whose RUNPATH keeps them
# together: a patched library never loads a stock one).
make_runtime_dir() { # $1 = stock build, $2 = patched build, $3 = destination
  local stock=$1 patched=$2 dst=$3 f name
  rm -rf "$dst.partial" && mkdir -p "$dst.partial/bin"
  for f in "$stock"/bin/*; do
    name=$(basename "$f")
    if [ -e "$patched/bin/$name" ] && [[ $name == libggml* || $name == libllama.so* ]]; then
      ln -s "$patched/bin/$name" "$dst.partial/bin/$name"
    else
      ln -s "$f" "$dst.partial/bin/$name"
    fi
  done
  cp "$patched/.skippy-complete" "$dst.partial/.skippy-patched-complete"
  rm -rf "$dst" && mv "$dst.partial" "$dst"
}

resolve_llama() {
  if [ -n "${LLAMA_STAGE_BUILD_DIR:-}" ]; then
    [ -x "$LLAMA_STAGE_BUILD_DIR/bin/llama-server" ] || die "LLAMA_STAGE_BUILD_DIR=$LLAMA_STAGE_BUILD_DIR has no bin/llama-server"
    local src="${LLAMA_CPP_SOURCE_DIR:-}"
    if [ -z "$src" ]; then
      src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$LLAMA_STAGE_BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)
    fi
    [ -f "$src/include/llama.h" ] || die "cannot find the llama.cpp source of $LLAMA_STAGE_BUILD_DIR; set LLAMA_CPP_SOURCE_DIR"
    SRC_DIR=$src; BUILD_DIR=$LLAMA_STAGE_BUILD_DIR
    return
  fi
  local key_opts key src
  key_opts=$(printf '%s\n' "${LLAMA_CMAKE_OPTS[@]}" "${LLAMA_TARGETS[@]}" "$(cpu_key)" "$(c++ --version | head -1)" | sha256sum | cut -c1-12)
  mkdir -p "$CACHE_DIR/llama.cpp"
  if [ -n "${LLAMA_CPP_SOURCE_DIR:-}" ]; then
    # A tree of the user's own is built as it is, without the patch series.
    [ -f "$LLAMA_CPP_SOURCE_DIR/include/llama.h" ] || die "LLAMA_CPP_SOURCE_DIR=$LLAMA_CPP_SOURCE_DIR is not a llama.cpp tree"
    src=$LLAMA_CPP_SOURCE_DIR
    # Keyed by its path and contents: a git tree by its commit, uncommitted changes and untracked
    # files, any other by its newest file, so an edited tree is built anew rather than served from
    # an older build.
    local tree
    if git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
      tree=$( { realpath "$src"; git -C "$src" rev-parse HEAD; git -C "$src" diff HEAD
                git -C "$src" ls-files -z --others --exclude-standard | (cd "$src" && xargs -0 -r stat -c '%n %Y'); } |
              sha256sum | cut -c1-12)
    else
      tree=$( { realpath "$src"; find "$src" -type f -printf '%T@ %p\n' | sort -n | tail -1; } | sha256sum | cut -c1-12)
    fi
    key="custom-$tree-$key_opts"
    ensure_build "$src" "$CACHE_DIR/llama.cpp/build-$key" LLAMA_TARGETS LLAMA_OUTPUTS
    SRC_DIR=$src; BUILD_DIR="$CACHE_DIR/llama.cpp/build-$key"
    return
  fi
  src="$CACHE_DIR/llama.cpp/src-$LLAMA_TAG-${LLAMA_COMMIT:0:12}"
  key="$LLAMA_TAG-${LLAMA_COMMIT:0:12}-$key_opts"
  # One fetcher at a time: two first runs would share $src.partial.
  exec 7>"$src.lock"
  flock 7
  if [ ! -f "$src/.skippy-fetched" ] || [ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" != "$LLAMA_COMMIT" ]; then
    fetch_source "$src"
    touch "$src/.skippy-fetched"
  fi
  flock -u 7
  local stock="$CACHE_DIR/llama.cpp/build-$key"
  ensure_build "$src" "$stock" LLAMA_TARGETS LLAMA_OUTPUTS
  [ -n "$(patch_series)" ] || { SRC_DIR=$src; BUILD_DIR=$stock; return; }

  local pd psrc pbld run
  pd=$(patch_digest)
  psrc="$CACHE_DIR/llama.cpp/src-$LLAMA_TAG-${LLAMA_COMMIT:0:12}-patched-$pd"
  exec 8>"$psrc.lock"
  flock 8
  if [ "$(cat "$psrc/.skippy-patches" 2>/dev/null)" != "$pd" ]; then
    make_patched_source "$src" "$psrc"
  fi
  flock -u 8
  pbld="$CACHE_DIR/llama.cpp/build-$key-patched-$pd"
  ensure_build "$psrc" "$pbld" PATCHED_TARGETS PATCHED_OUTPUTS
  run="$CACHE_DIR/llama.cpp/runtime-$key-patched-$pd"
  if ! cmp -s "$pbld/.skippy-complete" "$run/.skippy-patched-complete" 2>/dev/null ||
     [ ! -e "$run/bin/llama-server" ]; then
    make_runtime_dir "$stock" "$pbld" "$run"
  fi
  SRC_DIR=$psrc; BUILD_DIR=$run
}

install_apt
resolve_llama
echo "LLAMA_CPP_SOURCE_DIR=$SRC_DIR"
echo "LLAMA_CPP_BUILD_DIR=$BUILD_DIR"
