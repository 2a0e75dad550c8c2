#include "skippy/cache/batch_classes.h"

#include <gtest/gtest.h>

#include <random>

namespace skippy::cache {
namespace {

using ClassRun = BatchClasses::Run;

TEST(BatchClasses, WithoutAShortClassThePromptIsOneLongRun) {
  const std::vector<size_t> ends = {10, 30};
  auto c = BatchClasses::Of(100, ends, 2);
  EXPECT_EQ(c.runs(), (std::vector<ClassRun>{{0, 100, false}}));
  EXPECT_FALSE(c.has_short_runs());
  EXPECT_EQ(c.Fingerprint(), "");
  EXPECT_FALSE(c.CanStartAt(99));
  EXPECT_TRUE(c.CanStartAt(98));
  EXPECT_EQ(c.LastStartAtOrBelow(1000), 98u);
  EXPECT_EQ(c.LastStartAtOrBelow(0), 0u);
}

TEST(BatchClasses, ShortMessagesFormShortRuns) {
  // system 500 | question 20 | header 3 | long answer 100 | two short turns 30 + 10
  const std::vector<size_t> ends = {500, 520, 523, 623, 653};
  auto c = BatchClasses::Of(663, ends, 64);
  EXPECT_EQ(c.runs(), (std::vector<ClassRun>{{0, 500, false}, {500, 523, true}, {523, 623, false}, {623, 663, true}}));
  EXPECT_EQ(c.Fingerprint(), "500-523,623-663");
  // Without message ends the whole prompt is long; a short prompt is short.
  EXPECT_EQ(BatchClasses::Of(663, {}, 64).runs(), (std::vector<ClassRun>{{0, 663, false}}));
  EXPECT_EQ(BatchClasses::Of(40, {}, 64).runs(), (std::vector<ClassRun>{{0, 40, true}}));
}

TEST(BatchClasses, AOneRowShortRunJoinsItsLongNeighbour) {
  const std::vector<size_t> ends = {100, 101};
  EXPECT_EQ(BatchClasses::Of(300, ends, 64).runs(), (std::vector<ClassRun>{{0, 300, false}}));
  const std::vector<size_t> first = {1};
  EXPECT_EQ(BatchClasses::Of(300, first, 64).runs(), (std::vector<ClassRun>{{0, 300, false}}));
  const std::vector<size_t> last = {299};
  EXPECT_EQ(BatchClasses::Of(300, last, 64).runs(), (std::vector<ClassRun>{{0, 300, false}}));
}

TEST(BatchClasses, StartPointsLeaveAWholeBatchOfTheirClass) {
  const std::vector<size_t> ends = {500, 523};
  auto c = BatchClasses::Of(523, ends, 64);  // long [0,500), short [500,523)
  EXPECT_TRUE(c.CanStartAt(436));   // 64 long rows left
  EXPECT_FALSE(c.CanStartAt(437));  // 63 long rows: a short batch
  EXPECT_TRUE(c.CanStartAt(500));   // a run start
  EXPECT_TRUE(c.CanStartAt(521));   // two short rows left
  EXPECT_FALSE(c.CanStartAt(522));
  EXPECT_FALSE(c.CanStartAt(0));
  EXPECT_FALSE(c.CanStartAt(523));
  EXPECT_EQ(c.LastStartAtOrBelow(522), 521u);
  EXPECT_EQ(c.LastStartAtOrBelow(499), 436u);
  EXPECT_EQ(c.LastStartAtOrBelow(30), 30u);
  // A short first run: nothing inside the last two rows, and 0 is never a start.
  auto s = BatchClasses::Of(40, {}, 64);
  EXPECT_EQ(s.LastStartAtOrBelow(100), 38u);
  EXPECT_EQ(BatchClasses::Of(1, {}, 64).LastStartAtOrBelow(5), 0u);
}

TEST(BatchClasses, AgreementStopsAtTheFirstRowOfAnotherClass) {
  const std::vector<size_t> chat = {500, 520};
  auto a = BatchClasses::Of(523, chat, 64);  // long [0,500) short [500,523)
  auto raw = BatchClasses::Of(523, {}, 64);  // the same tokens as one raw prompt: all long
  EXPECT_EQ(a.AgreesUpTo(raw), 500u);
  EXPECT_EQ(raw.AgreesUpTo(a), 500u);
  EXPECT_EQ(a.AgreesUpTo(a), 523u);
  // The next turn: the header rows of the last prompt are inside a short assistant message.
  const std::vector<size_t> next_ends = {500, 520, 540, 560};
  auto next = BatchClasses::Of(563, next_ends, 64);
  EXPECT_EQ(next.AgreesUpTo(a), 523u);
  // ...unless the answer was long: then they are long rows and agreement ends at the header.
  const std::vector<size_t> long_ends = {500, 520, 600, 620};
  EXPECT_EQ(BatchClasses::Of(623, long_ends, 64).AgreesUpTo(a), 520u);
  EXPECT_EQ(a.Prefix(510).AgreesUpTo(a), 510u);
  EXPECT_EQ(a.Prefix(510).runs(), (std::vector<ClassRun>{{0, 500, false}, {500, 510, true}}));
}

TEST(BatchClasses, CutsNeverMixClassesNorLeaveASmallBatch) {
  const std::vector<size_t> ends = {500, 523, 623, 653};
  auto c = BatchClasses::Of(663, ends, 64);
  const std::vector<size_t> stops = {128, 470, 500, 510, 600, 640, 662};
  auto cuts = c.Cut(0, stops, 256);
  // 470 would leave 30 long rows, 600 23, 662 one short row; 510 and 640 keep 2+ short rows.
  EXPECT_EQ(cuts.stops, (std::vector<size_t>{128, 500, 510, 640}));
  EXPECT_EQ(cuts.batch_ends, (std::vector<size_t>{128, 314, 500, 510, 523, 623, 640, 663}));
  // From a restored prefix inside the long run.
  auto from = c.Cut(436, {}, 256);
  EXPECT_EQ(from.batch_ends, (std::vector<size_t>{500, 523, 623, 663}));
  EXPECT_TRUE(c.Cut(663, {}, 256).batch_ends.empty());
}

TEST(BatchClasses, ShortSegmentsAddingUpToALongBatchAreLong) {
  // Twenty 10-row lines: one 200-row run of short segments, prefilled as a long run.
  std::vector<size_t> ends;
  for (size_t e = 10; e < 200; e += 10) ends.push_back(e);
  auto c = BatchClasses::Of(200, ends, 64);
  ASSERT_EQ(c.runs(), (std::vector<ClassRun>{{0, 200, false}}));
  EXPECT_EQ(c.Cut(0, {}, 128).batch_ends, (std::vector<size_t>{100, 200}));
  // A conversation's short tail turns long once it reaches 64 rows: the earlier prompt's short
  // rows then disagree from the start of that run.
  const std::vector<size_t> turn1 = {500, 520};
  const std::vector<size_t> turn2 = {500, 520, 560, 580};
  auto a = BatchClasses::Of(523, turn1, 64), b = BatchClasses::Of(583, turn2, 64);
  EXPECT_EQ(b.runs(), (std::vector<ClassRun>{{0, 583, false}}));
  EXPECT_EQ(b.AgreesUpTo(a), 500u);
}

// Every batch a cut makes lies in one run and keeps its class's size, from any start point.
TEST(BatchClasses, RandomizedCutsKeepEveryBatchInItsClass) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t n = std::uniform_int_distribution<size_t>(2, 900)(rng);
    std::vector<size_t> ends, stops;
    const int k = std::uniform_int_distribution<int>(0, 12)(rng);
    for (int i = 0; i < k; ++i) ends.push_back(std::uniform_int_distribution<size_t>(0, n + 5)(rng));
    for (int i = 0; i < k; ++i) stops.push_back(std::uniform_int_distribution<size_t>(1, n)(rng));
    const size_t min_long = trial % 3 == 0 ? 2 : 64;
    auto c = BatchClasses::Of(n, ends, min_long);
    size_t covered = 0;
    for (const ClassRun& r : c.runs()) {
      ASSERT_EQ(r.begin, covered);
      ASSERT_GT(r.end, r.begin);
      if (c.runs().size() > 1) {
        ASSERT_GE(r.end - r.begin, r.short_rows ? 2u : min_long);
      }
      covered = r.end;
    }
    ASSERT_EQ(covered, n);
    const size_t from = trial % 2 ? c.LastStartAtOrBelow(std::uniform_int_distribution<size_t>(0, n)(rng)) : 0;
    auto cuts = c.Cut(from, stops, 128);
    size_t at = from;
    for (size_t e : cuts.batch_ends) {
      ASSERT_GT(e, at);
      bool one_run = false;
      for (const ClassRun& r : c.runs()) {
        if (r.begin <= at && e <= r.end) {
          one_run = true;
          if (c.runs().size() > 1 || !r.short_rows) {
            ASSERT_GE(e - at, r.short_rows ? 2u : min_long) << "n " << n << " from " << from;
          }
          ASSERT_LE(e - at, r.short_rows ? min_long - 1 : 128u);
        }
      }
      ASSERT_TRUE(one_run);
      at = e;
    }
    ASSERT_EQ(at, from < n ? n : from);
    for (size_t s : cuts.stops) ASSERT_TRUE(std::binary_search(cuts.batch_ends.begin(), cuts.batch_ends.end(), s));
  }
}

}  // namespace
}  // namespace skippy::cache
