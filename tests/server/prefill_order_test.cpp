// NextPrefill: which lane's prefill chunk runs next between two steps of the decoding lanes.
#include "skippy/server/prefill_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace skippy::server {
namespace {

TEST(PrefillOrder, NothingToPrefill) { EXPECT_FALSE(NextPrefill({}, 8).has_value()); }

TEST(PrefillOrder, AShortJobGoesBeforeALongOneAlreadyUnderWay) {
  // A long cold prompt with 5 chunks left, a hit admitted after it with its suffix in one chunk.
  const std::vector<PrefillCandidate> c = {{5, 0, 0}, {1, 1, 0}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
}

TEST(PrefillOrder, EqualJobsKeepTheOrderTheyCameIn) {
  // A burst of cold prompts: the first admitted finishes before the next one starts.
  std::vector<PrefillCandidate> c = {{2, 7, 0}, {2, 5, 0}, {2, 6, 0}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
  c[1].chunks_left = 1;
  EXPECT_EQ(NextPrefill(c, 8), 1u) << "the lane under way has fewer chunks left";
}

TEST(PrefillOrder, ALanePassedOverLongEnoughGoesFirst) {
  std::vector<PrefillCandidate> c = {{9, 0, 7}, {1, 3, 0}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
  c[0].passed_over = 8;
  EXPECT_EQ(NextPrefill(c, 8), 0u) << "overdue";
  // Of two overdue lanes the first admitted goes first, whatever is left.
  c = {{1, 4, 9}, {6, 2, 8}, {1, 0, 0}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
}

}  // namespace
}  // namespace skippy::server
