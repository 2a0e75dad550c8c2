// Paths and helpers the runtime tests share; paths are compile definitions from the build,
// overridable by environment.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "skippy/certify/state_handoff.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/engine.h"

namespace skippy::testing_env {

inline std::string ZooDir() {
  if (const char* v = std::getenv("SKIPPY_ZOO_DIR")) return v;
  return SKIPPY_TEST_ZOO_DIR;
}
inline std::string ZooFile(std::string_view key) { return StrCat(ZooDir(), "/", key, ".gguf"); }

// Compute threads per test engine: 1, as the server tests' `-t 1`. ctest runs as many tests at once
// as there are cores (scripts/test.sh), and two spinning two-thread pools on two cores make each
// test several times slower (a barrier waits on a thread that is not running). The production
// default, two, is covered by the runtime.two_threads test, which ctest runs alone
// (SKIPPY_TEST_THREADS=2, RUN_SERIAL).
inline int Threads() {
  if (const char* v = std::getenv("SKIPPY_TEST_THREADS")) return std::max(1, std::atoi(v));
  return 1;
}

// skippy-server's layout: one KV stream per lane, full-size sliding-window layers, no cache
// sequences.
inline runtime::EngineOptions ServerLayout(std::string_view family, bool flash_attn, uint32_t lanes, uint32_t n_ctx) {
  runtime::EngineOptions o;
  o.model_path = ZooFile(family);
  o.context.n_ctx = n_ctx;
  o.context.flash_attn = flash_attn;
  o.context.kv_unified = false;
  o.context.swa_full = true;
  o.lane_count = lanes;
  o.cache_seq_count = 0;
  o.context.n_threads = Threads();
  return o;
}
// An engine in the server's layout on a zoo family (a key) or a GGUF (a path), 1024 cells per lane;
// null, with a test failure, where it does not open.
// `graphs`, when set, counts the graphs it computes (ContextOptions::graph_count).
inline std::unique_ptr<runtime::Engine> OpenServerLayout(const std::string& path_or_family, bool flash_attn,
                                                         uint32_t lanes, std::atomic<uint64_t>* graphs = nullptr) {
  auto o = ServerLayout(path_or_family, flash_attn, lanes, /*n_ctx=*/1024 * lanes);
  if (path_or_family.find('/') != std::string::npos) o.model_path = path_or_family;
  o.context.graph_count = graphs;
  auto e = runtime::Engine::Open(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}
inline std::string VocabDir() { return SKIPPY_TEST_VOCAB_DIR; }
inline std::string CorrectnessBin() { return SKIPPY_TEST_CORRECTNESS_BIN; }

inline constexpr const char* kPrompt =
    "You are a careful assistant. Summarize the following design note in two sentences: the cache "
    "keeps attention state for shared prefixes and restores it exactly.";

// kPrompt's tokens padded or cut to exactly n (certify::BenchmarkTokens); empty on failure.
inline std::vector<runtime::Token> Tokens(const runtime::Engine& e, int32_t n) {
  auto t = certify::BenchmarkTokens(e.model(), kPrompt, n);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : std::vector<runtime::Token>{};
}

// Two empty vectors are the same (memcmp is not called on their null data).
inline bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline runtime::Token Argmax(const std::vector<float>& v) {
  return static_cast<runtime::Token>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace skippy::testing_env
