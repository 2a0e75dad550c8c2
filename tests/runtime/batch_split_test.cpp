// The batch-split check (certify/batch_split.h) on every tiny zoo family: it passes with the
// runtime's rule (2-row batches with the batch-invariant patches; stock, 64-row with flash
// attention on), and it can fail: on the stock kernels with flash attention on, cuts down to 2-row
// batches change the logits of every family whose attention reaches the tiled kernel. With flash attention on it also proves the short class:
// rows after a long batch give the same logits in one short batch or cut into several.
#include <algorithm>
#include <gtest/gtest.h>

#include "skippy/certify/batch_split.h"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"
#include "test_env.h"

namespace {

using skippy::runtime::Engine;
namespace env = skippy::testing_env;

std::unique_ptr<Engine> Open(const std::string& family, bool flash_attn) {
  auto e = Engine::Open(env::ServerLayout(family, flash_attn, /*lanes=*/1, /*n_ctx=*/1024));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

class BatchSplit : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchSplit, RuleHoldsWithFlashAttentionOnAndOff) {
  for (bool fa : {true, false}) {
    auto e = Open(GetParam(), fa);
    ASSERT_NE(e, nullptr);
    // With the batch-invariant patches (the bootstrap's build) 2 rows either way; stock, 64 with
    // flash attention on.
    EXPECT_EQ(e->MinExactBatch(), skippy::runtime::BatchInvariant() ? 2u : fa ? 64u : 2u);
    auto r = skippy::certify::CheckBatchSplits(*e, 0, e->MinExactBatch());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->pass) << GetParam() << " flash_attn=" << fa << ": " << r->ToJson().dump();
    EXPECT_EQ(r->cuts.size(), 5u + skippy::certify::kRandomCuts);
    for (const auto& cut : r->cuts) {
      size_t sum = 0;
      for (size_t b : cut) {
        EXPECT_GE(b, e->MinExactBatch());
        EXPECT_LE(b, e->context().options().n_batch);
        sum += b;
      }
      EXPECT_EQ(sum, r->n_tokens);
    }
    // With flash attention on, rows after a long batch are also cut into short batches of 2+ rows
    // (cache::BatchClasses); every such cut must match one short batch.
    EXPECT_EQ(r->short_cuts.size(), e->MinExactBatch() > 2 ? 5u : 0u);
    for (size_t i = 0; i < r->short_cuts.size(); ++i) {
      EXPECT_TRUE(r->short_prompt_equal[i] && r->short_state_equal[i] && r->short_decode_equal[i])
          << GetParam() << " short cut " << i;
      EXPECT_LT(r->short_cuts[i].back(), e->MinExactBatch());
    }
    EXPECT_EQ(e->SequenceLength(0), 0) << "the check leaves the lane empty";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, BatchSplit,
                         ::testing::Values("llama", "qwen3", "glm4", "olmo", "gemma2", "gemma3", "gemma4-a4b", "gemma4-e4b",
                                           "deepseek2", "deepseek3", "glm47-flash", "minimax-m27", "qwen3next", "falcon-h1"));

// The check has teeth: on the stock kernels with flash attention on, 2-row batches take the
// untiled kernel and change the last bits (measured on every tiny family but qwen3next, whose
// attention heads the tiled kernel does not take). The batch-invariant patch takes the tiled path
// from 2 rows, which RuleHoldsWithFlashAttentionOnAndOff proves.
TEST(BatchSplitCheck, FailsWhenBatchesCrossTheFlashAttentionTile) {
  skippy::runtime::SetBatchInvariant(false);  // before the first model: this process keeps stock kernels
  for (const char* family : {"llama", "gemma3", "deepseek2", "falcon-h1"}) {
    auto e = Open(family, true);
    ASSERT_NE(e, nullptr);
    auto r = skippy::certify::CheckBatchSplits(*e, 0, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->pass) << family << ": " << r->ToJson().dump();
    EXPECT_TRUE(r->prompt_equal[0] && r->state_equal[0]) << "the reference equals itself";
    // The state comparison has teeth too: the short batches' KV differs from the reference's.
    EXPECT_NE(std::count(r->state_equal.begin(), r->state_equal.end(), false), 0) << family << ": " << r->ToJson().dump();
  }
}

TEST(BatchSplitCheck, RefusesBadArguments) {
  auto e = Open("llama", false);
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(skippy::certify::CheckBatchSplits(*e, 0, 0).ok());
  EXPECT_FALSE(skippy::certify::CheckBatchSplits(*e, 5, 2).ok()) << "no lane 5";
  EXPECT_FALSE(skippy::certify::CheckBatchSplits(*e, 0, 400).ok()) << "n_batch 512 < 2 x 400";
}

}  // namespace
