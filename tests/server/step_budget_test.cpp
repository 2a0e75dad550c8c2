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
  EXPECT_EQ(PrefillRowsWithinTpot(50, lanes, 10, 0.5), 60u);  // (40 - 10) / 0.5
  // Without B, A's slack (ahead of the SLO so far) goes to the prefill.
  EXPECT_EQ(PrefillRowsWithinTpot(50, std::span(lanes).first(1), 10, 0.5), 160u);
}

TEST(StepBudget, ALaneBehindItsSloAllowsNoRows) {
  const std::vector<DecodingLaneClock> lanes = {{2, 130}};  // due 100 ms after its first token
  EXPECT_EQ(PrefillRowsWithinTpot(50, lanes, 5, 1), 0u);
  EXPECT_EQ(PrefillRowsWithinTpot(50, std::vector<DecodingLaneClock>{{2, 96}}, 5, 1), 0u) << "the step alone is late";
}

TEST(StepBudget, NothingBoundsAPrefillWithoutSloLaneOrCost) {
  const std::vector<DecodingLaneClock> lanes = {{1, 0}};
  EXPECT_FALSE(PrefillRowsWithinTpot(0, lanes, 1, 1));
  EXPECT_FALSE(PrefillRowsWithinTpot(50, {}, 1, 1));
  EXPECT_FALSE(PrefillRowsWithinTpot(50, lanes, 1, 0)) << "no prefill timed yet";
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
