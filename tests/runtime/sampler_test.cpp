// Sampler: greedy takes the lowest id among the maxima; the repetition penalties (llama.cpp's
// penalties sampler, first in the chain as in llama-server) count the history given at creation
// and every sampled token, within their window; out-of-range values are refused.
#include "skippy/runtime/sampler.h"

#include <gtest/gtest.h>

#include <vector>

namespace skippy::runtime {
namespace {

constexpr int32_t kVocab = 4;
const std::vector<float> kLogits = {0.0f, 5.0f, 4.5f, 1.0f};  // token 1 first, token 2 close behind

Token Greedy(SamplingParams p, std::vector<Token> history) {
  auto s = Sampler::Create(p, kVocab, history);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? (*s)->Sample(kLogits) : -1;
}

TEST(Sampler, GreedyTakesTheLowestIdAmongTheMaxima) {
  auto s = Sampler::Create({}, kVocab);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Sample(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
}

TEST(Sampler, PenaltiesCountTheHistoryAndTheSampledTokensInTheirWindow) {
  SamplingParams p;
  EXPECT_EQ(Greedy(p, {1, 1, 1}), 1);  // no penalty
  p.frequency_penalty = 0.4f;          // per occurrence
  EXPECT_EQ(Greedy(p, {1}), 1);        // 5 - 0.4 > 4.5
  EXPECT_EQ(Greedy(p, {1, 1}), 2);     // 5 - 0.8 < 4.5
  p = {};
  p.presence_penalty = 1.0f;           // once, whatever the count: 5 - 1 < 4.5
  EXPECT_EQ(Greedy(p, {1}), 2);
  p = {};
  p.repeat_penalty = 2.0f;             // 5 / 2 < 4.5
  EXPECT_EQ(Greedy(p, {3, 1}), 2);
  p.penalty_last_n = 1;                // only the last token (3) is in the window
  EXPECT_EQ(Greedy(p, {1, 3}), 1);

  // A sampled token joins the history: greedy alternates under a strong presence penalty.
  p = {};
  p.presence_penalty = 1.0f;
  auto s = Sampler::Create(p, kVocab, {});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Sample(kLogits), 1);
  EXPECT_EQ((*s)->Sample(kLogits), 2);  // 1 was sampled: 4 < 4.5
  EXPECT_EQ((*s)->Sample(kLogits), 1);  // both penalized once: 4 > 3.5
}

TEST(Sampler, OutOfRangePenaltiesAreRefused) {
  for (auto set : std::vector<void (*)(SamplingParams&)>{
           [](SamplingParams& p) { p.repeat_penalty = 0.0f; },
           [](SamplingParams& p) { p.repeat_penalty = 11.0f; },
           [](SamplingParams& p) { p.frequency_penalty = 2.5f; },
           [](SamplingParams& p) { p.presence_penalty = -2.5f; },
           [](SamplingParams& p) { p.penalty_last_n = -1; },
           [](SamplingParams& p) { p.penalty_last_n = (1 << 20) + 1; }}) {
    SamplingParams p;
    set(p);
    EXPECT_FALSE(Sampler::Validate(p).ok());
    EXPECT_FALSE(Sampler::Create(p, kVocab).ok());
  }
  SamplingParams p;
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(Sampler::Create(p, 0).ok()) << "penalties need the vocabulary size";
}

}  // namespace
}  // namespace skippy::runtime
