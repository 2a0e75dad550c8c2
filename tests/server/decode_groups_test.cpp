// DecodeGroups: how a round's decoding lanes are split into steps, from measured step costs.
#include "skippy/server/decode_groups.h"

#include <gtest/gtest.h>

#include <vector>

namespace skippy::server {
namespace {

using Groups = std::vector<std::vector<int32_t>>;

TEST(DecodeGroups, WithoutCostsEveryRunOfConsecutiveLanesIsOneStep) {
  const std::vector<int32_t> lanes = {0, 1, 2, 5, 6, 9};
  EXPECT_EQ(DecodeGroups(lanes, {}), (Groups{{0, 1, 2}, {5, 6}, {9}}));
  EXPECT_TRUE(DecodeGroups({}, {}).empty());
}

TEST(DecodeGroups, TwoLanesStepAloneWhereTwoRowsCostMoreThanTwoSteps) {
  // Costs as measured on a 2-core CPU with a Q4_K_M model: two rows cost more than two lone steps,
  // three and four rows less.
  const std::vector<double> ms = {7.3, 15.4, 17.5, 19.2};
  EXPECT_EQ(DecodeGroups(std::vector<int32_t>{0, 1}, ms), (Groups{{0}, {1}}));
  EXPECT_EQ(DecodeGroups(std::vector<int32_t>{1, 2, 3}, ms), (Groups{{1, 2, 3}}));
  EXPECT_EQ(DecodeGroups(std::vector<int32_t>{0, 1, 2, 3}, ms), (Groups{{0, 1, 2, 3}}));
  // Lanes that do not follow each other are never grouped.
  EXPECT_EQ(DecodeGroups(std::vector<int32_t>{0, 2}, ms), (Groups{{0}, {2}}));
}

TEST(DecodeGroups, WithRaggedStepsLanesApartAreOneRun) {
  const std::vector<int32_t> lanes = {0, 2, 3, 6};
  EXPECT_EQ(DecodeGroups(lanes, {}, /*ragged=*/true), (Groups{{0, 2, 3, 6}}));
  EXPECT_EQ(DecodeGroups(lanes, {}, /*ragged=*/false), (Groups{{0}, {2, 3}, {6}}));
  // Cut by the measured costs like a run: two rows cost more than two lone steps here, four less.
  const std::vector<double> ms = {7.3, 15.4, 17.5, 19.2};
  EXPECT_EQ(DecodeGroups(std::vector<int32_t>{0, 2}, ms, true), (Groups{{0}, {2}}));
  EXPECT_EQ(DecodeGroups(lanes, ms, true), (Groups{{0, 2, 3, 6}}));
  EXPECT_EQ(DecodeGroups(std::vector<int32_t>{1, 4, 7}, ms, true), (Groups{{1, 4, 7}}));
}

TEST(DecodeGroups, ATieGoesToFewerSteps) {
  EXPECT_EQ(DecodeGroups(std::vector<int32_t>{3, 4}, std::vector<double>{10, 20}), (Groups{{3, 4}}));
}

TEST(DecodeGroups, MoreLanesThanMeasuredSizesAreCutIntoMeasuredSizesAtTheLeastCost) {
  const std::vector<double> ms = {10, 12};
  const Groups g = DecodeGroups(std::vector<int32_t>{0, 1, 2, 3, 4}, ms);
  double cost = 0;
  std::vector<int32_t> flat;
  for (const auto& group : g) {
    ASSERT_GE(group.size(), 1u);
    ASSERT_LE(group.size(), 2u);
    cost += ms[group.size() - 1];
    flat.insert(flat.end(), group.begin(), group.end());
  }
  EXPECT_EQ(flat, (std::vector<int32_t>{0, 1, 2, 3, 4}));  // every lane once, in order
  EXPECT_DOUBLE_EQ(cost, 34);                                // two pairs and one lane alone
  EXPECT_EQ(g.size(), 3u);
}

}  // namespace
}  // namespace skippy::server
