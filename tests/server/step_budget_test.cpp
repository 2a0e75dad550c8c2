// The --tpot-slo-ms step budget (step_budget.h): the prefill gets what the tightest decoding lane
// can spare before its next token, less the decode step, at the measured cost per row; nothing
// bounds it without an SLO, a decoding lane or a cost; and the cost follows its samples.
#include <gtest/gtest.h>

#include <vector>

#include "skippy/server/step_budget.h"

namespace skippy::server {
namespace {

TEST(StepBudget, TheTightestLaneBoundsThePrefill) {
  // SLO 50 ms. Lane A: 3 tokens, the first 60 ms ago: its 4th token is due by 3 * 50 = 150 ms
  // after its first, 90 ms from now. Lane B: 1 token, 10 ms ago: due in 40 ms. The step takes 10.
  // Both have 20 tokens to go.
  const std::vector<DecodingLaneClock> lanes = {{3, 60, 20}, {1, 10, 20}};
  EXPECT_EQ(PrefillRowsWithinTpot(50, lanes, 10, 0.5, 8), 60u);  // (40 - 10) / 0.5
  // Without B, A's slack (ahead of the SLO so far) goes to the prefill.
  EXPECT_EQ(PrefillRowsWithinTpot(50, std::span(lanes).first(1), 10, 0.5, 8), 160u);
}

TEST(StepBudget, ALaneBehindGetsTheSmallestPieceWhileItCanCatchUp) {
  // 2 tokens, the first 130 ms ago: its 3rd was due 30 ms ago. With 20 tokens to go (its last due
  // 1,050 ms after its first; 20 steps of 10 ms and 64 rows at 0.5 ms take 840 ms) it catches up:
  // the smallest piece. With 2 to go (its last due in 20 ms, two such steps take 84) it cannot:
  // late anyway, it bounds nothing.
  EXPECT_EQ(PrefillRowsWithinTpot(50, std::vector<DecodingLaneClock>{{2, 130, 20}}, 10, 0.5, 64), 64u);
  EXPECT_FALSE(PrefillRowsWithinTpot(50, std::vector<DecodingLaneClock>{{2, 130, 2}}, 10, 0.5, 64));
  // A late lane beside one on time: the one on time bounds it.
  EXPECT_EQ(PrefillRowsWithinTpot(50, std::vector<DecodingLaneClock>{{2, 130, 2}, {1, 0, 20}}, 10, 0.5, 64), 80u);
  // A lane with nothing left to stream (its last token out, the lane finishing) bounds nothing.
  EXPECT_FALSE(PrefillRowsWithinTpot(50, std::vector<DecodingLaneClock>{{5, 10, 0}}, 10, 0.5, 64));
}

TEST(StepBudget, NothingBoundsAPrefillWithoutSloLaneOrCost) {
  const std::vector<DecodingLaneClock> lanes = {{1, 0, 10}};
  EXPECT_FALSE(PrefillRowsWithinTpot(0, lanes, 1, 1, 1));
  EXPECT_FALSE(PrefillRowsWithinTpot(50, {}, 1, 1, 1));
  EXPECT_FALSE(PrefillRowsWithinTpot(50, lanes, 1, 0, 1)) << "no prefill timed yet";
}

TEST(StepBudget, APromptThatCanStillMeetItsTtftKeepsItsBatch) {
  // 200 rows at 1 ms, 250 ms left: on time whole; in pieces of 64 (4 pieces, a 20 ms step after
  // each: 280 ms) it would not be.
  EXPECT_TRUE(TtftOutranksTpot(250, 200, 64, 1, 20));
  EXPECT_FALSE(TtftOutranksTpot(300, 200, 64, 1, 20)) << "on time in pieces too";
  EXPECT_FALSE(TtftOutranksTpot(150, 200, 64, 1, 20)) << "late anyway";
  EXPECT_FALSE(TtftOutranksTpot(-5, 200, 64, 1, 20)) << "past its deadline";
}

TEST(StepBudget, TheCostFollowsItsSamples) {
  CostEstimate c;
  EXPECT_EQ(c.per_unit(), 0);
  c.Add(100, 100);
  EXPECT_DOUBLE_EQ(c.per_unit(), 1.0);
  c.Add(-1, 10);  // ignored
  c.Add(5, 0);    // ignored
  EXPECT_DOUBLE_EQ(c.per_unit(), 1.0);
  for (int i = 0; i < 60; ++i) c.Add(200, 100);  // the machine slowed down to 2 ms per row
  EXPECT_NEAR(c.per_unit(), 2.0, 0.01);
}

}  // namespace
}  // namespace skippy::server
