// skippy-kernel-bench: what the batch-invariant kernels cost (runtime/llama_backend.h), measured
// in one process on one context so that the two kernel sets see the same memory, threads and
// machine state.
//
//   SKIPPY_BENCH_MODEL=FILE.gguf [SKIPPY_BENCH_FA=on|off] [SKIPPY_BENCH_TOKENS=1500]
//     build/bin/skippy-kernel-bench --benchmark_repetitions=9 --benchmark_report_aggregates_only=true
//
//   Prefill   a cold prefill of TOKENS tokens in batches of 512 (one lane, cleared first), the
//             last batch with an output row
//   Decode    32 greedy one-token decodes after a 256-token prefix (not timed), ms per token
//   Suffix    a SUFFIX-token prefill (SKIPPY_BENCH_SUFFIX, default 16) after a 1,024-token prefix
//             (not timed), with its output row: what a prefix hit prefills (a stock llama-server
//             computes batches under 64 rows with flash attention's one-row path, row by row)
//   FlashAttn/N  no model: one flash attention op of N query rows over 1,040 F16 cells, causal
//             mask, in the shape SKIPPY_BENCH_FA_SHAPE="DK,HEADS,KV_HEADS" (default 256,4,1: bench
//             Gemma3; 64,16,4 is bench Llama), microseconds per op (median of 50)
//   Q6KColumns/N  no model: the patch series' Q6_K column kernel (ggml_vec_dot_q6_K_q8_K_cols,
//             x86 AVX2) against N one-row calls, over 65,536 x 1,024 random Q6_K weights (54 MB,
//             past this machine's caches) on one thread; it first checks that every column has
//             the one-row bits
// Each repetition runs both kernel sets back to back (alternating which goes first) and reports
// stock_ms, invariant_ms and their ratio (FlashAttn: microseconds in those fields); the median
// ratio over repetitions is the cost.
//
// The switch is flipped between decodes, never during one: llama.cpp plans the CPU graph
// (and sizes its work buffer) at every compute, so each decode runs wholly on one kernel set.
// Skippy itself sets the mode once, before its first context.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"

namespace {

using skippy::runtime::Engine;
using skippy::runtime::Token;

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : fallback;
}

Engine& TheEngine() {
  static std::unique_ptr<Engine> engine = [] {
    skippy::runtime::EngineOptions o;
    o.model_path = Env("SKIPPY_BENCH_MODEL", "");
    o.context.n_ctx = 4096;
    o.context.n_batch = o.context.n_ubatch = 512;
    o.context.n_threads = std::atoi(Env("SKIPPY_BENCH_THREADS", "2").c_str());
    o.context.flash_attn = Env("SKIPPY_BENCH_FA", "on") == "on";
    o.context.kv_unified = false;
    o.lane_count = 1;
    o.cache_seq_count = 0;
    auto e = Engine::Open(o);
    if (!e.ok()) {
      std::fprintf(stderr, "skippy-kernel-bench: %s (set SKIPPY_BENCH_MODEL)\n", e.status().ToString().c_str());
      std::exit(2);
    }
    return std::move(*e);
  }();
  return *engine;
}

// Distinct, in-vocabulary, deterministic token ids.
std::vector<Token> Tokens(size_t n) {
  std::vector<Token> t(n);
  const int32_t vocab = TheEngine().model().n_vocab();
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<Token>(1000 + (i * 7919) % static_cast<size_t>(vocab - 1000));
  return t;
}

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Runs `work` once on each kernel set, back to back, alternating which goes first from one call to
// the next, and reports both times and their ratio (invariant / stock; above 1: slower). Pairs
// cancel the drift of a busy machine that separate runs would measure.
template <typename Work>
void Pair(benchmark::State& state, Work work) {
  static int calls = 0;
  if (!skippy::runtime::BatchInvariantAvailable()) {
    state.SkipWithError("no batch-invariant switch in this build");
    return;
  }
  double ms[2] = {0, 0};
  for (auto _ : state) {
    const bool invariant_first = (calls++ % 2) == 0;
    for (bool invariant : {invariant_first, !invariant_first}) {
      skippy::runtime::SetBatchInvariant(invariant);
      ms[invariant ? 1 : 0] = work();
      if (ms[invariant ? 1 : 0] < 0) {
        state.SkipWithError("decode failed");
        return;
      }
    }
  }
  state.counters["stock_ms"] = ms[0];
  state.counters["invariant_ms"] = ms[1];
  state.counters["ratio"] = ms[1] / ms[0];
}

void Prefill(benchmark::State& state) {
  Engine& e = TheEngine();
  const auto tokens = Tokens(std::atoi(Env("SKIPPY_BENCH_TOKENS", "1500").c_str()));
  Pair(state, [&] {
    (void)e.Clear(0);
    const auto t0 = std::chrono::steady_clock::now();
    auto logits = e.Decode(0, tokens, 0);
    return logits.ok() ? Ms(std::chrono::steady_clock::now() - t0) : -1.0;
  });
  state.counters["tokens"] = static_cast<double>(tokens.size());
}

// Milliseconds per token of 32 greedy one-token decodes after a 256-token prefix (not timed).
void Decode(benchmark::State& state) {
  Engine& e = TheEngine();
  constexpr int kSteps = 32;
  const auto prefix = Tokens(256);
  Pair(state, [&] {
    (void)e.Clear(0);
    auto logits = e.Decode(0, prefix, 0);
    const auto t0 = std::chrono::steady_clock::now();
    int32_t pos = static_cast<int32_t>(prefix.size());
    for (int i = 0; i < kSteps && logits.ok(); ++i, ++pos) {
      Token next = static_cast<Token>(std::max_element(logits->begin(), logits->end()) - logits->begin());
      logits = e.Decode(0, std::span(&next, 1), pos);
    }
    return logits.ok() ? Ms(std::chrono::steady_clock::now() - t0) / kSteps : -1.0;
  });
}

// A short prefill after a long prefix: the prefix is computed again before each timed suffix (a
// sliding-window lane cannot be cut back to it).
void Suffix(benchmark::State& state) {
  Engine& e = TheEngine();
  const auto prefix = Tokens(1024);
  const auto all = Tokens(1024 + static_cast<size_t>(std::atoi(Env("SKIPPY_BENCH_SUFFIX", "16").c_str())));
  const std::span<const Token> suffix = std::span(all).subspan(prefix.size());
  Pair(state, [&] {
    (void)e.Clear(0);
    if (!e.Prefill(0, prefix, 0).ok()) return -1.0;
    const auto t0 = std::chrono::steady_clock::now();
    auto logits = e.Decode(0, suffix, static_cast<int32_t>(prefix.size()));
    return logits.ok() ? Ms(std::chrono::steady_clock::now() - t0) : -1.0;
  });
  state.counters["rows"] = static_cast<double>(suffix.size());
}

// One flash attention op, F32 queries over an F16 cache (what llama.cpp computes per layer).
void FlashAttn(benchmark::State& state) {
  skippy::runtime::EnsureLlamaBackend();
  int dk = 256, heads = 4, kv_heads = 1;
  if (std::sscanf(Env("SKIPPY_BENCH_FA_SHAPE", "256,4,1").c_str(), "%d,%d,%d", &dk, &heads, &kv_heads) != 3) {
    state.SkipWithError("SKIPPY_BENCH_FA_SHAPE is DK,HEADS,KV_HEADS");
    return;
  }
  constexpr int kCells = 1040;
  const int rows = static_cast<int>(state.range(0));
  ggml_init_params params{};
  params.mem_size = 512u << 20;
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dk, rows, heads);
  ggml_tensor* k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, dk, kCells, kv_heads);
  ggml_tensor* v = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, dk, kCells, kv_heads);
  ggml_tensor* mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, kCells, rows);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < ggml_nelements(q); ++i) static_cast<float*>(q->data)[i] = normal(rng);
  for (ggml_tensor* t : {k, v}) {
    for (int64_t i = 0; i < ggml_nelements(t); ++i) static_cast<ggml_fp16_t*>(t->data)[i] = ggml_fp32_to_fp16(normal(rng));
  }
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < kCells; ++c) {
      static_cast<ggml_fp16_t*>(mask->data)[r * kCells + c] = ggml_fp32_to_fp16(c <= kCells - rows + r ? 0.0f : -INFINITY);
    }
  }
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.1f, 0.0f, 0.0f);
  ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  const int threads = std::atoi(Env("SKIPPY_BENCH_THREADS", "2").c_str());
  Pair(state, [&] {
    std::vector<double> us;
    for (int i = 0; i < 50; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (ggml_graph_compute_with_ctx(ctx, graph, threads) != GGML_STATUS_SUCCESS) return -1.0;
      us.push_back(Ms(std::chrono::steady_clock::now() - t0) * 1000.0);
    }
    std::nth_element(us.begin(), us.begin() + 25, us.end());
    return us[25];
  });
  ggml_free(ctx);
}

// The Q6_K column kernel: N one-row dot products per weight row against one call for N columns.
void Q6KColumns(benchmark::State& state) {
  using DotFn = void (*)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
  using ColsFn = void (*)(int, float*, size_t, const void*, const void* const*, int);
  using QuantizeFn = void (*)(const float*, void*, int64_t);
  skippy::runtime::EnsureLlamaBackend();
  const auto one_row = reinterpret_cast<DotFn>(dlsym(RTLD_DEFAULT, "ggml_vec_dot_q6_K_q8_K"));
  const auto cols = reinterpret_cast<ColsFn>(dlsym(RTLD_DEFAULT, "ggml_vec_dot_q6_K_q8_K_cols"));
  const auto quantize_q8_K = reinterpret_cast<QuantizeFn>(dlsym(RTLD_DEFAULT, "quantize_row_q8_K"));
  if (one_row == nullptr || cols == nullptr || quantize_q8_K == nullptr) {
    state.SkipWithError("no Q6_K column kernel in this build (the patch series, x86 AVX2)");
    return;
  }
  constexpr int kN = 1024, kRows = 65536, kChunk = 4096, kMaxCols = 8;
  const int ncols = static_cast<int>(state.range(0));
  const size_t w_row = ggml_row_size(GGML_TYPE_Q6_K, kN), a_row = ggml_row_size(GGML_TYPE_Q8_K, kN);
  static std::vector<uint8_t> wq, aq;
  if (wq.empty()) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> f(static_cast<size_t>(kN) * kChunk);
    wq.resize(w_row * kRows);
    for (int r = 0; r < kRows; r += kChunk) {
      for (float& v : f) v = normal(rng);
      ggml_quantize_chunk(GGML_TYPE_Q6_K, f.data(), wq.data() + r * w_row, 0, kChunk, kN, nullptr);
    }
    aq.resize(a_row * kMaxCols);
    for (int c = 0; c < kMaxCols; ++c) quantize_q8_K(f.data() + static_cast<size_t>(c) * kN, aq.data() + c * a_row, kN);
  }
  const void* columns[kMaxCols];
  for (int c = 0; c < kMaxCols; ++c) columns[c] = aq.data() + c * a_row;

  for (int r = 0; r < kRows; r += 97) {
    float want = 0, got[kMaxCols];
    cols(kN, got, 1, wq.data() + r * w_row, columns, ncols);
    for (int c = 0; c < ncols; ++c) {
      one_row(kN, &want, 0, wq.data() + r * w_row, 0, columns[c], 0, 1);
      if (std::memcmp(&want, &got[c], sizeof(float)) != 0) {
        state.SkipWithError("a column's result differs from the one-row function's");
        return;
      }
    }
  }

  static int calls = 0;
  double ms[2] = {0, 0};  // N one-row calls per weight row; one call for N columns
  float sink = 0, out[kMaxCols];
  for (auto _ : state) {
    const bool calls_first = (calls++ % 2) == 0;
    for (bool one_row_calls : {calls_first, !calls_first}) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < kRows; ++r) {
        const void* w = wq.data() + r * w_row;
        if (one_row_calls) {
          for (int c = 0; c < ncols; ++c) one_row(kN, &out[c], 0, w, 0, columns[c], 0, 1);
        } else {
          cols(kN, out, 1, w, columns, ncols);
        }
        sink += out[0];
      }
      ms[one_row_calls ? 0 : 1] = Ms(std::chrono::steady_clock::now() - t0);
    }
  }
  benchmark::DoNotOptimize(sink);
  state.counters["one_row_calls_ms"] = ms[0];
  state.counters["columns_ms"] = ms[1];
  state.counters["speedup"] = ms[0] / ms[1];
}

BENCHMARK(Prefill)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Decode)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Suffix)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FlashAttn)->Arg(2)->Arg(16)->Arg(64)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Q6KColumns)->DenseRange(1, 8)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
