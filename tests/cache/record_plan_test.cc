#include "skippy/cache/record_plan.h"

#include <gtest/gtest.h>

namespace skippy::cache {
namespace {

// Exact-boundary (KvRecurrent) planning with a grid of `stride` and `max_records` records.
RecordPlanOptions ExactBoundary(size_t stride, size_t max_records, size_t tail_tokens = 0) {
  RecordPlanOptions o;
  o.kind = PayloadKind::kKvRecurrent;
  o.stride = stride;
  o.max_records = max_records;
  o.tail_tokens = tail_tokens;
  return o;
}

// The plan's boundaries; empty (and a test failure) when planning fails.
std::vector<size_t> Boundaries(const PromptShape& p, const RecordPlanOptions& o) {
  auto plan = PlanRecords(p, o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? plan->boundaries : std::vector<size_t>{};
}

TEST(RecordPlan, ResidentKvRecordsOnlyTheFullPrompt) {
  PromptShape p{1000, {200, 700}, std::nullopt};
  RecordPlanOptions o;
  o.kind = PayloadKind::kResidentKv;
  o.stride = 256;
  auto plan = PlanRecords(p, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->boundaries, std::vector<size_t>({1000}));
  EXPECT_EQ(plan->chunk_ends, std::vector<size_t>({1000}));
}

TEST(RecordPlan, RecurrentRecordsFullPromptTurnBoundaryAndGrid) {
  PromptShape p{1000, {200, 700}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(256, 8);
  auto plan = PlanRecords(p, o);
  ASSERT_TRUE(plan.ok());
  // 768 is within half a stride of the turn boundary 700: skipped.
  EXPECT_EQ(plan->boundaries, std::vector<size_t>({256, 512, 700, 1000}));
  EXPECT_EQ(plan->chunk_ends, plan->boundaries);
}

TEST(RecordPlan, GridSkipsPointsNextToChosenBoundaries) {
  // A 514-token miss with the n - 4 tail record: the grid point 512 would serve what 510 serves, so
  // the six records spread further down the prompt instead.
  PromptShape p{514, {}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(64, 6, 4);
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({128, 256, 384, 448, 510, 514}));
}

TEST(RecordPlan, ChunkCutsComeFirstInTheGrid) {
  // Prefill cuts a 1812-token miss every 512 tokens anyway: records there cost no extra batch.
  PromptShape p{1812, {}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(64, 6, 4);
  o.free_every = 512;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({512, 1024, 1536, 1728, 1808, 1812}));
  // After a restored prefix the cuts move with it.
  o.restored_tokens = 100;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({612, 1124, 1636, 1728, 1808, 1812}));
}

TEST(RecordPlan, SpreadGridPointsThatCutABatchAreCapped) {
  // The same miss as above with room for ten records: the chunk cuts are free, and the two longest
  // grid points (1792 is next to the tail: 1728 only) serve the next short question on this text;
  // the cap holds the points spread over the rest, each one more batch.
  PromptShape p{1812, {}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(64, 10, 4);
  o.free_every = 512;
  o.max_paid_grid = 0;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({512, 1024, 1536, 1728, 1808, 1812}));
  o.max_paid_grid = 2;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({448, 512, 896, 1024, 1536, 1728, 1808, 1812}));
  // The named records (prompt end, turn, tail) are not grid points: a cap of 0 keeps them.
  PromptShape chat{1000, {200, 700}, std::nullopt};
  o.free_every = 0;
  o.max_paid_grid = 0;
  EXPECT_EQ(Boundaries(chat, o), std::vector<size_t>({700, 896, 960, 996, 1000}));
  o.max_paid_grid = 1;
  EXPECT_EQ(Boundaries(chat, o), std::vector<size_t>({448, 700, 896, 960, 996, 1000}));
}

TEST(RecordPlan, BranchPointComesRightAfterTheFullPrompt) {
  PromptShape p{1000, {200, 700}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(256, 2, 4);
  o.branch_point = 930;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({930, 1000}));
  o.max_records = 4;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({700, 930, 996, 1000}));
  // Not beyond the restored prefix, not at the prompt end.
  o.restored_tokens = 930;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({996, 1000}));
  o.restored_tokens = 0;
  o.branch_point = 1000;
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({512, 700, 996, 1000}));
}

TEST(RecordPlan, BudgetKeepsHighestPriorityBoundaries) {
  PromptShape p{1000, {200, 700}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(256, 3);
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({512, 700, 1000}));
}

TEST(RecordPlan, ByteBudgetSkipsWhatDoesNotFit) {
  PromptShape p{1000, {}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(250, 10);
  o.bytes_per_token = 1;
  o.bytes_per_record = 100;
  o.max_bytes = 1500;  // 1000+100 fits; then 750+100 does not, 500+100 does not, 250+100 fits
  auto plan = PlanRecords(p, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->boundaries, std::vector<size_t>({250, 1000}));
  EXPECT_EQ(plan->planned_bytes, 1450u);
}

TEST(RecordPlan, BoundariesStartAfterRestoredPrefixAndChunksAreBounded) {
  PromptShape p{1000, {}, 600};
  RecordPlanOptions o;
  o.kind = PayloadKind::kKvRecurrent;
  o.restored_tokens = 512;
  o.max_chunk_tokens = 200;
  o.stride = 256;
  auto plan = PlanRecords(p, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->boundaries, std::vector<size_t>({600, 768, 1000}));
  EXPECT_EQ(plan->chunk_ends, std::vector<size_t>({600, 768, 968, 1000}));
}

TEST(RecordPlan, FewRecordsSpreadOverTheGrid) {
  PromptShape p{2048, {}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(64, 6);
  // Grid 64..1984 (31 points below the prompt end): the two longest (1984, 1920: the last one is
  // often inside a short question), the middle of the other 29 (960), then the middles of the
  // halves (512, 1472).
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({512, 960, 1472, 1920, 1984, 2048}));
}

TEST(RecordPlan, TailBoundaryComesRightAfterTheTurn) {
  PromptShape p{1000, {}, std::nullopt};
  RecordPlanOptions o = ExactBoundary(256, 3, 4);
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({768, 996, 1000}));
  o.tail_tokens = 1000;  // not shorter than the prompt: ignored
  EXPECT_EQ(Boundaries(p, o), std::vector<size_t>({512, 768, 1000}));
}

TEST(RecordPlan, BadInputIsRefused) {
  RecordPlanOptions o;
  EXPECT_EQ(PlanRecords({0, {}, std::nullopt}, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanRecords({10, {5, 3}, std::nullopt}, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanRecords({10, {11}, std::nullopt}, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.restored_tokens = 11;
  EXPECT_EQ(PlanRecords({10, {}, std::nullopt}, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RecordPlan, ExactRepeatNeedsNoPrefill) {
  RecordPlanOptions o;
  o.restored_tokens = 10;
  auto plan = PlanRecords({10, {}, std::nullopt}, o);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->boundaries.empty());
  EXPECT_TRUE(plan->chunk_ends.empty());
}

}  // namespace
}  // namespace skippy::cache
