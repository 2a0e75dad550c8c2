// Engine::DecodeStep and the lane-batching check (certify/lane_batching.h): a lane's generated
// tokens come out the same whether it steps alone or with other lanes of any length, the check
// passes on every dense tiny zoo family with flash attention on and off, and the pad row is needed:
// without it (or with the pad's logits not computed) a lane's logits move with its neighbours.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "skippy/certify/lane_batching.h"
#include "skippy/certify/state_handoff.h"
#include "skippy/runtime/engine.h"
#include "test_env.h"

namespace {

using skippy::runtime::Context;
using skippy::runtime::Engine;
using skippy::runtime::Token;
namespace env = skippy::testing_env;

std::unique_ptr<Engine> Open(const std::string& family, bool flash_attn, uint32_t lanes) {
  auto e = Engine::Open(env::ServerLayout(family, flash_attn, lanes, /*n_ctx=*/1024 * lanes));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

using env::Argmax;
using env::SameBytes;
using env::Tokens;

class LaneBatching : public ::testing::TestWithParam<std::string> {};

TEST_P(LaneBatching, CheckPasses) {
  for (bool fa : {false, true}) {
    auto e = Open(GetParam(), fa, 2);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->CanDecodeSteps());
    auto r = skippy::certify::CheckLaneBatching(*e, 0, 1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->pass) << GetParam() << " flash_attn=" << fa << ": " << r->ToJson().dump();
    EXPECT_EQ(r->tokens_b, 600u) << "lane b crosses two more 256-cell steps than lane a";
    EXPECT_EQ(e->SequenceLength(0), 0);
    EXPECT_EQ(e->SequenceLength(1), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LaneBatching,
                         ::testing::Values("llama", "qwen3", "glm4", "olmo", "gemma2", "gemma3", "gemma4-a4b", "gemma4-e4b",
                                           "deepseek2", "deepseek3", "glm47-flash", "minimax-m27"));

// Three lanes of different lengths generate 12 greedy tokens each, once alone and once stepping
// together (lanes joining and leaving on the way): every lane's logits are byte-identical.
TEST(DecodeStep, AGreedyContinuationDoesNotDependOnTheOtherLanes) {
  auto e = Open("llama", false, 3);
  ASSERT_NE(e, nullptr);
  const auto tokens = Tokens(*e, 700);
  const int32_t lens[3] = {30, 700, 260};
  constexpr int kSteps = 12;
  auto prefill = [&](int32_t lane) {
    ASSERT_TRUE(e->Clear(lane).ok());
    auto l = e->Decode(lane, std::span(tokens).first(static_cast<size_t>(lens[lane])), 0);
    ASSERT_TRUE(l.ok()) << l.status();
    return;
  };
  // Alone: each lane by itself.
  std::vector<std::vector<std::vector<float>>> alone(3);
  for (int32_t lane = 0; lane < 3; ++lane) {
    prefill(lane);
    Token t = tokens[5];
    for (int s = 0; s < kSteps; ++s) {
      Engine::DecodeStepIn in{lane, t, lens[lane] + s};
      auto l = e->DecodeStep(std::span(&in, 1));
      ASSERT_TRUE(l.ok()) << l.status();
      ASSERT_EQ(e->SequenceLength(lane), lens[lane] + s + 1) << "the pad row is gone";
      t = Argmax((*l)[0]);
      alone[lane].push_back(std::move((*l)[0]));
    }
  }
  // Together: lane 1 steps alone, lane 0 joins at round 4, lane 2 at round 8; lane 1 leaves at
  // round 12, so lanes 0 and 2 step without it (two ubatches: llama.cpp batches only consecutive
  // sequence ids), then lane 2 alone.
  for (int32_t lane = 0; lane < 3; ++lane) prefill(lane);
  const int start[3] = {4, 0, 8};
  Token next[3] = {tokens[5], tokens[5], tokens[5]};
  int done[3] = {0, 0, 0};
  for (int round = 0; round < kSteps + 8; ++round) {
    std::vector<Engine::DecodeStepIn> in;
    for (int32_t lane = 0; lane < 3; ++lane) {
      if (round >= start[lane] && done[lane] < kSteps) in.push_back({lane, next[lane], lens[lane] + done[lane]});
    }
    if (in.empty()) break;
    auto l = e->DecodeStep(in);
    ASSERT_TRUE(l.ok()) << l.status();
    for (size_t i = 0; i < in.size(); ++i) {
      const int32_t lane = in[i].lane;
      EXPECT_TRUE(SameBytes((*l)[i], alone[lane][done[lane]])) << "lane " << lane << " step " << done[lane];
      next[lane] = Argmax((*l)[i]);
      ++done[lane];
    }
  }
  EXPECT_EQ(done[0] + done[1] + done[2], 3 * kSteps);
}

// Why DecodeStep pads: a lane's one row next to a long lane, or its pad row without logits next
// to another lane's output row, gives other bits than the same row stepped by itself. (Tiny
// models show the second; the first needs the bench zoo's sizes: docs/DESIGN.md.)
TEST(DecodeStep, WithoutThePadsLogitsALaneMovesWithItsNeighbours) {
  auto e = Open("llama", false, 2);
  ASSERT_NE(e, nullptr);
  const auto tokens = Tokens(*e, 600);
  ASSERT_TRUE(e->Prefill(0, std::span(tokens).first(40), 0).ok());
  ASSERT_TRUE(e->Prefill(1, tokens, 0).ok());
  auto run = [&](std::vector<Context::Row> rows) {
    auto l = e->context().DecodeRows(rows);
    EXPECT_TRUE(l.ok()) << l.status();
    for (const auto& r : rows) EXPECT_TRUE(e->Truncate(r.seq, std::min(r.pos, e->SequenceLength(r.seq))).ok());
    return l.ok() ? (*l)[0] : std::vector<float>{};
  };
  const Token t = tokens[3];
  const auto alone = run({{0, 40, t, true}, {0, 41, t, false}});
  const auto beside = run({{0, 40, t, true}, {0, 41, t, false}, {1, 600, t, true}, {1, 601, t, false}});
  EXPECT_FALSE(SameBytes(alone, beside)) << "one output row vs two took the same kernel: DecodeStep's "
                                            "pad logits would be unnecessary";
  const auto padded = run({{0, 40, t, true}, {0, 41, t, true}});
  const auto padded_beside = run({{0, 40, t, true}, {0, 41, t, true}, {1, 600, t, true}, {1, 601, t, true}});
  EXPECT_TRUE(SameBytes(padded, padded_beside));
}

TEST(DecodeStep, RefusesBadStepsAndRecurrentModels) {
  auto e = Open("llama", false, 2);
  ASSERT_NE(e, nullptr);
  const auto tokens = Tokens(*e, 8);
  ASSERT_TRUE(e->Prefill(0, tokens, 0).ok());
  using In = Engine::DecodeStepIn;
  auto code = [&](std::vector<In> in) { return e->DecodeStep(in).status().code(); };
  EXPECT_EQ(code({}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{0, tokens[0], 7}}), absl::StatusCode::kInvalidArgument) << "not appending";
  EXPECT_EQ(code({{0, tokens[0], 8}, {0, tokens[0], 8}}), absl::StatusCode::kInvalidArgument) << "a lane twice";
  EXPECT_EQ(code({{2, tokens[0], 0}}), absl::StatusCode::kInvalidArgument) << "no lane 2";
  EXPECT_EQ(code({{0, -1, 8}}), absl::StatusCode::kInvalidArgument) << "bad token";
  EXPECT_EQ(e->SequenceLength(0), 8) << "a refused step leaves the lane alone";
  // The last cell of a lane leaves no room for the pad row.
  const int32_t cap = e->LaneCapacity();
  ASSERT_TRUE(e->Clear(1).ok());
  ASSERT_TRUE(e->Prefill(1, Tokens(*e, cap - 1), 0).ok());
  EXPECT_EQ(code({{1, tokens[0], cap - 1}}), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(e->Truncate(1, cap - 2).ok());
  EXPECT_TRUE(e->DecodeStep(std::vector<In>{{1, tokens[0], cap - 2}}).ok()) << "the last cell holds the pad";
  EXPECT_EQ(e->SequenceLength(1), cap - 1);
  EXPECT_TRUE(e->DecodeStep(std::vector<In>{{0, tokens[0], 8}}).ok()) << "still usable";

  // A lane's two rows must share a ubatch: three lanes need six rows.
  auto o = env::ServerLayout("llama", false, 3, 3 * 256);
  o.context.n_batch = o.context.n_ubatch = 4;
  auto small = Engine::Open(o);
  ASSERT_TRUE(small.ok()) << small.status();
  for (int32_t lane = 0; lane < 3; ++lane) ASSERT_TRUE((*small)->Prefill(lane, std::span(tokens).first(4), 0).ok());
  EXPECT_EQ((*small)->DecodeStep(std::vector<In>{{0, tokens[0], 4}, {1, tokens[0], 4}, {2, tokens[0], 4}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*small)->DecodeStep(std::vector<In>{{0, tokens[0], 4}, {1, tokens[0], 4}}).ok());

  for (const char* hybrid : {"qwen3next", "falcon-h1"}) {
    auto h = Open(hybrid, false, 2);
    ASSERT_NE(h, nullptr);
    EXPECT_FALSE(h->CanDecodeSteps());
    EXPECT_EQ(skippy::certify::CheckLaneBatching(*h, 0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
    const auto ht = Tokens(*h, 8);
    ASSERT_TRUE(h->Prefill(0, ht, 0).ok());
    EXPECT_EQ(h->DecodeStep(std::vector<In>{{0, ht[0], 8}}).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(h->SequenceLength(0), 8);
  }
}

}  // namespace
