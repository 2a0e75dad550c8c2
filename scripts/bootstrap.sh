#!/usr/bin/env bash
# Installs what Skippy needs on a fresh Debian machine, idempotently:
#   1. Debian packages by name (only the ones the build uses);
#   2. llama.cpp from the pinned npm package node-llama-cpp (a git bundle inside it),
#      digest-verified, built once into a cache outside the checkout keyed by version and options.
# Prints the llama.cpp source and build directories as shell assignments on its last two lines
# (LLAMA_CPP_SOURCE_DIR=..., LLAMA_CPP_BUILD_DIR=...) so callers can `eval` them.
#
# Overrides:
#   LLAMA_STAGE_BUILD_DIR   an existing llama.cpp build (with bin/llama-server); no build is done.
#   LLAMA_CPP_SOURCE_DIR    an existing llama.cpp source tree; built into the cache, keyed by its commit.
#   SKIPPY_CACHE_DIR        where slow artefacts live (default: ${XDG_CACHE_HOME:-~/.cache}/skippy).
#   SKIPPY_SKIP_APT=1       do not touch Debian packages (for machines you manage yourself).
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
#   libcpp-httplib-dev             HTTP client/server (tests, bench, skippy-server)
#   libcli11-dev                   command-line parsing
#   libxxhash-dev                  fast non-cryptographic hashing for the cache index
#   libssl-dev                     SHA-256 for model identity and payload digests
#   libabsl-dev                    absl::Status / StatusOr: errors as values across the project
#   libfmt-dev                     string formatting (messages, keys, tables)
#   gnuplot-nox                    PNG charts in the benchmark report
#   curl                           health checks in shell scripts
APT_PACKAGES=(cmake ninja-build g++ git libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libxxhash-dev libssl-dev libabsl-dev libfmt-dev gnuplot-nox curl)

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
LLAMA_TARGETS=(llama llama-server ggml-rpc-server)
# The files a complete build must have; their digests are recorded in the stamp and re-checked.
LLAMA_OUTPUTS=(bin/libllama.so bin/libggml.so bin/libggml-base.so bin/libggml-cpu.so bin/libggml-rpc.so
  bin/llama-server bin/ggml-rpc-server)

stamp_body() { # $1 = build dir
  local f
  for f in "${LLAMA_OUTPUTS[@]}"; do
    [ -f "$1/$f" ] || return 1
    printf '%s  %s\n' "$(sha256sum "$1/$f" | cut -d' ' -f1)" "$f"
  done
}

build_is_complete() { # $1 = build dir
  [ -f "$1/.skippy-complete" ] || return 1
  local now
  now=$(stamp_body "$1") || return 1
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

build_llama() { # $1 = source dir, $2 = build dir
  local src=$1 bld=$2 jobs
  jobs=$(nproc)
  log "building llama.cpp ($(basename "$bld")) with $jobs jobs; this takes several minutes once"
  rm -rf "$bld"
  cmake -S "$src" -B "$bld" -G Ninja "${LLAMA_CMAKE_OPTS[@]}" >&2
  cmake --build "$bld" -j "$jobs" --target "${LLAMA_TARGETS[@]}" >&2
  stamp_body "$bld" > "$bld/.skippy-complete.tmp" || die "llama.cpp build is missing outputs"
  mv "$bld/.skippy-complete.tmp" "$bld/.skippy-complete"
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
  if [ -n "${LLAMA_CPP_SOURCE_DIR:-}" ]; then
    [ -f "$LLAMA_CPP_SOURCE_DIR/include/llama.h" ] || die "LLAMA_CPP_SOURCE_DIR=$LLAMA_CPP_SOURCE_DIR is not a llama.cpp tree"
    src=$LLAMA_CPP_SOURCE_DIR
    key="custom-$( (git -C "$src" rev-parse HEAD 2>/dev/null || echo nogit) | cut -c1-12)-$key_opts"
  else
    src="$CACHE_DIR/llama.cpp/src-$LLAMA_TAG-${LLAMA_COMMIT:0:12}"
    key="$LLAMA_TAG-${LLAMA_COMMIT:0:12}-$key_opts"
    if [ ! -f "$src/.skippy-fetched" ] || [ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" != "$LLAMA_COMMIT" ]; then
      mkdir -p "$CACHE_DIR/llama.cpp"
      fetch_source "$src"
      touch "$src/.skippy-fetched"
    fi
  fi
  local bld="$CACHE_DIR/llama.cpp/build-$key"
  mkdir -p "$CACHE_DIR/llama.cpp"
  # One builder at a time per cache entry; a second caller waits and then reuses the result.
  exec 9>"$bld.lock"
  flock 9
  if build_is_complete "$bld"; then
    log "reusing cached llama.cpp build $bld"
  else
    [ -d "$bld" ] && log "cached llama.cpp build $bld is incomplete or corrupt; rebuilding"
    build_llama "$src" "$bld"
  fi
  flock -u 9
  SRC_DIR=$src; BUILD_DIR=$bld
}

install_apt
resolve_llama
echo "LLAMA_CPP_SOURCE_DIR=$SRC_DIR"
echo "LLAMA_CPP_BUILD_DIR=$BUILD_DIR"
