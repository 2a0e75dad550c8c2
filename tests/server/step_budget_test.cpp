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
  const std::vector<DecodingLaneClock> lanes = {{3, 60}, {1, 10}};
  EXPECT_EQ(PrefillRowsWithinTpot(50, lanes, 10, 0.5, 8), 60u);  // (40 - 10) / 0.5
  // Without B, A's slack (ahead of the SLO so far) goes to the prefill.
  EXPECT_EQ(PrefillRowsWithinTpot(50, std::span(lanes).first(1), 10, 0.5, 8), 160u);
}

TEST(StepBudget, ALaneLateAnywayBoundsNothing) {
  // A is due in 40 ms: the step (10) and the smallest piece (64 rows, 32 ms) do not fit, so B's
  // 90 ms bound the prefill; with A alone nothing does.
  const std::vector<DecodingLaneClock> lanes = {{1, 10}, {3, 60}};
  EXPECT_EQ(PrefillRowsWithinTpot(50, lanes, 10, 0.5, 64), 160u);
  EXPECT_FALSE(PrefillRowsWithinTpot(50, std::span(lanes).first(1), 10, 0.5, 64));
  // Just enough for the smallest piece: that piece.
  EXPECT_EQ(PrefillRowsWithinTpot(50, std::vector<DecodingLaneClock>{{1, 8}}, 10, 0.5, 64), 64u);
}

TEST(StepBudget, NothingBoundsAPrefillWithoutSloLaneOrCost) {
  const std::vector<DecodingLaneClock> lanes = {{1, 0}};
  EXPECT_FALSE(PrefillRowsWithinTpot(0, lanes, 1, 1, 1));
  EXPECT_FALSE(PrefillRowsWithinTpot(50, {}, 1, 1, 1));
  EXPECT_FALSE(PrefillRowsWithinTpot(50, lanes, 1, 0, 1)) << "no prefill timed yet";
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
