// Quantized weights: the small zoo (tiny depth, 256-wide matrices, so K-quant tensors really are
// Q4_K / Q6_K) in Q4_K_M, Q8_0 and IQ2_XS for a dense GQA (llama), a sliding-window (gemma3), an
// MLA (deepseek2) and a hybrid MoE (qwen3next) family. With the batch-invariant products of
// Skippy's llama.cpp patch series (runtime/llama_backend.h) the batch-split check passes with
// flash attention on and off and the production payload restores bit-exact; on the stock kernels
// the check fails on Q4_K_M (repacked products) and IQ2_XS (the IQ panel GEMM from 8 rows), which
// is what the patches are for (and what keeps these tests honest: the files do take those kernels).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>

#include "skippy/certify/batch_split.h"
#include "skippy/certify/state_handoff.h"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"
#include "test_env.h"

namespace {

using skippy::StrCat;
using skippy::runtime::Engine;
namespace env = skippy::testing_env;

std::string SmallFile(const std::string& family, const std::string& format) {
  return StrCat(SKIPPY_TEST_SMALL_ZOO_DIR, "/", family, ".", format, ".gguf");
}

std::unique_ptr<Engine> Open(const std::string& family, const std::string& format, bool flash_attn) {
  auto o = env::ServerLayout(family, flash_attn, /*lanes=*/1, /*n_ctx=*/1024);
  o.model_path = SmallFile(family, format);
  auto e = Engine::Open(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(BatchInvariant, IsOnInTheBootstrapBuild) {
  // The bootstrap builds ggml from the patched tree; a stock build (LLAMA_STAGE_BUILD_DIR) has no
  // switch and serves repacked formats without the cache.
  if (std::string(SKIPPY_TEST_LLAMA_PATCHES) == "none") GTEST_SKIP() << "llama.cpp built without the patch series";
  ASSERT_TRUE(skippy::runtime::BatchInvariantAvailable())
      << "the patched libggml-cpu is not the one loaded (check the runtime directory's links)";
  skippy::runtime::EnsureLlamaBackend();
  EXPECT_TRUE(skippy::runtime::BatchInvariant());
}

TEST(KernelBuild, NamesTheCpuFeaturesTheKernelsWereBuiltFor) {
  // Entries on disk and in a shared tier are refused by a server whose kernels add otherwise.
  const std::string features = skippy::runtime::CpuKernelFeatures();
#if defined(__x86_64__)
  EXPECT_NE(("," + features + ",").find(",sse3,"), std::string::npos) << features;
#endif
  EXPECT_NE(skippy::runtime::KernelBuild().find("+cpu:" + features), std::string::npos)
      << skippy::runtime::KernelBuild();
}

using Case = std::tuple<std::string, std::string>;  // family, format
class Quantized : public ::testing::TestWithParam<Case> {};

TEST_P(Quantized, BatchSplitPassesWithFlashAttentionOnAndOff) {
  const auto& [family, format] = GetParam();
  for (bool fa : {false, true}) {
    auto e = Open(family, format, fa);
    ASSERT_NE(e, nullptr);
    auto r = skippy::certify::CheckBatchSplits(*e, 0, e->MinExactBatch());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->pass) << family << " " << format << " flash_attn=" << fa << ": " << r->ToJson().dump();
  }
}

TEST_P(Quantized, ProductionPayloadRestoresBitExact) {
  const auto& [family, format] = GetParam();
  skippy::certify::StateHandoffOptions o;
  o.model_path = SmallFile(family, format);
  o.prompt = env::kPrompt;
  o.prefix_token_count = 128;
  o.cache_hit_repeats = 2;
  o.ctx_size = 512;
  o.threads = env::Threads();
  auto result = skippy::certify::RunStateHandoff(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->verdict, skippy::certify::Verdict::kPass) << result->report.dump(2);
  EXPECT_TRUE(result->report["suffix_prefill_matches"].get<bool>());
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string n = StrCat(std::get<0>(info.param), "_", std::get<1>(info.param));
  for (char& c : n) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(SmallZoo, Quantized,
                         ::testing::Combine(::testing::Values("llama", "gemma3", "deepseek2", "qwen3next"),
                                            ::testing::Values("Q4_K_M", "Q8_0", "IQ2_XS")),
                         CaseName);

TEST(QuantizedStockKernels, BatchSplitFailsOnQ4KM) {
  // Chosen before the first model loads, so the process keeps llama.cpp's stock products.
  if (!skippy::runtime::SetBatchInvariant(false)) GTEST_SKIP() << "no batch-invariant switch in this build";
  auto e = Open("llama", "Q4_K_M", /*flash_attn=*/false);
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(skippy::runtime::BatchInvariant());
  auto r = skippy::certify::CheckBatchSplits(*e, 0, e->MinExactBatch());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->pass) << "stock kernels agreed under every cut: the Q4_K_M file no longer exercises the "
                           "repacked products, so the tests above prove nothing about them";
}

TEST(QuantizedStockKernels, BatchSplitFailsOnIQ2XS) {
  // Stock, a batch under 8 rows takes the IQ dot product and a larger one the panel GEMM (and the
  // mix's Q2_K tensors the repacked products); the cuts' short batches (2-9 rows) put the same
  // prompt's rows on both sides, and its KV differs.
  if (!skippy::runtime::SetBatchInvariant(false)) GTEST_SKIP() << "no batch-invariant switch in this build";
  auto e = Open("llama", "IQ2_XS", /*flash_attn=*/false);
  ASSERT_NE(e, nullptr);
  auto r = skippy::certify::CheckBatchSplits(*e, 0, e->MinExactBatch());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->pass) << "stock kernels agreed under every cut: the IQ2_XS file no longer exercises the IQ "
                           "panel GEMM or the repacked Q2_K products, so the IQ2_XS cases above prove nothing about them";
}

}  // namespace
