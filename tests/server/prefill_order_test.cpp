// NextPrefill: which lane's prefill chunk runs next between two steps of the decoding lanes.
// SharedPrefillToWaitFor: whether a job waits for another lane to compute a prefix they share.
#include "skippy/server/prefill_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace skippy::server {
namespace {

TEST(PrefillOrder, NothingToPrefill) { EXPECT_FALSE(NextPrefill({}, 8).has_value()); }

TEST(PrefillOrder, AShortJobGoesBeforeALongOneAlreadyUnderWay) {
  // A long cold prompt with 1,500 rows left, a hit admitted after it with a 20-row suffix.
  const std::vector<PrefillCandidate> c = {{1500, 0, 0, 512}, {20, 1, 0, 20}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
}

TEST(PrefillOrder, AHitGoesBeforeAColdPromptOfOneChunk) {
  // Both are one chunk of 512; the hit's 15 rows go first although it came second.
  const std::vector<PrefillCandidate> c = {{510, 0, 0, 510}, {15, 1, 0, 15}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
}

TEST(PrefillOrder, EqualJobsKeepTheOrderTheyCameIn) {
  // A burst of cold prompts: the first admitted finishes before the next one starts.
  std::vector<PrefillCandidate> c = {{1000, 7, 0, 512}, {1000, 5, 0, 512}, {1000, 6, 0, 512}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
  c[1].rows_left = 488;
  EXPECT_EQ(NextPrefill(c, 8), 1u) << "the lane under way has fewer rows left";
  // Within a step of rows, the order of admission: 300 and 260 rows are both five steps of 64.
  c = {{300, 1, 0, 300}, {260, 2, 0, 260}};
  EXPECT_EQ(NextPrefill(c, 8), 0u);
}

TEST(PrefillOrder, ALanePassedOverLongEnoughGoesFirst) {
  std::vector<PrefillCandidate> c = {{4000, 0, 7, 512}, {30, 3, 0, 30}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
  c[0].passed_over = 8;
  EXPECT_EQ(NextPrefill(c, 8), 0u) << "overdue";
  // Of two overdue lanes the first admitted goes first, whatever is left.
  c = {{30, 4, 9, 30}, {3000, 2, 8, 512}, {30, 0, 0, 30}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
}

TEST(PrefillOrder, AJobThatCanStillMeetItsTtftGoesBeforeALateOne) {
  // A hit's 20-row suffix that is already late, and a 300-row prompt that can still make it.
  std::vector<PrefillCandidate> c = {{20, 0, 0, 20, /*late=*/true}, {300, 1, 0, 300}};
  EXPECT_EQ(NextPrefill(c, 8), 1u);
  c[1].late = true;
  EXPECT_EQ(NextPrefill(c, 8), 0u) << "both late: the fewest rows first again";
  c = {{20, 0, 8, 20, /*late=*/true}, {300, 1, 0, 300}};
  EXPECT_EQ(NextPrefill(c, 8), 0u) << "an overdue lane goes first, late or not";
}

// The picks of one turn, asked after every chunk as the scheduler does, with no job arriving in
// between: lane i is c[i]; its chunks are next_rows long (its last one shorter), and a pick resets
// its lane's passed_over and adds one to the others'.
std::vector<size_t> Turn(const std::vector<PrefillCandidate>& c, size_t overdue, size_t budget_rows) {
  std::vector<PrefillCandidate> lanes = c;
  PrefillTurn turn(c.size(), budget_rows);
  std::vector<size_t> picks;
  while (true) {
    std::vector<PrefillCandidate> candidates;
    std::vector<size_t> lane;
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (lanes[i].rows_left == 0 || !turn.Open(i)) continue;
      candidates.push_back(lanes[i]);
      lane.push_back(i);
    }
    const std::optional<size_t> pick = turn.Next(candidates, overdue);
    if (!pick) break;
    const size_t id = lane[*pick];
    turn.Ran(id, lanes[id]);
    picks.push_back(id);
    for (size_t i : lane) ++lanes[i].passed_over;
    PrefillCandidate& p = lanes[id];
    p.passed_over = 0;
    p.rows_left -= p.next_rows;
    p.next_rows = std::min(c[id].next_rows, p.rows_left);
  }
  return picks;
}

TEST(PrefillOrder, ATurnRunsShortChunksTogetherAndALongOneAlone) {
  // Three hits' suffixes and a cold prompt: the suffixes fit one turn of 512 rows, in order (40
  // and 15 rows are one step of 64, so they keep the order they came in).
  const std::vector<PrefillCandidate> c = {{510, 0, 0, 510}, {40, 1, 0, 40}, {15, 2, 0, 15}, {90, 3, 0, 90}};
  EXPECT_EQ(Turn(c, 8, 512), (std::vector<size_t>{1, 2, 3}));
  // The cold prompt alone is the next turn; a first chunk larger than the budget still runs.
  const std::vector<PrefillCandidate> cold = {{510, 0, 0, 510}};
  EXPECT_EQ(Turn(cold, 8, 256), (std::vector<size_t>{0}));
  // The first that does not fit ends the turn, even if a later one would.
  const std::vector<PrefillCandidate> d = {{300, 0, 0, 300}, {250, 1, 0, 250}, {600, 2, 5, 100}};
  EXPECT_EQ(Turn(d, 5, 512), (std::vector<size_t>{2, 1})) << "overdue first, then the fewest rows";
  EXPECT_FALSE(PrefillTurn(0, 512).Next({}, 8).has_value());
}

TEST(PrefillOrder, ALaneRunsSeveralChunksInATurnOnlyWhenItsWholePrefillFits) {
  // A hit cut short at its records (60 rows in chunks of 30) finishes in one turn, before a longer
  // prompt.
  const std::vector<PrefillCandidate> e = {{300, 0, 0, 300}, {60, 1, 0, 30}};
  EXPECT_EQ(Turn(e, 8, 512), (std::vector<size_t>{1, 1, 0}));
  // So does a prompt that fits the budget alone, whatever its chunks.
  const std::vector<PrefillCandidate> f = {{400, 0, 0, 100}};
  EXPECT_EQ(Turn(f, 8, 512), (std::vector<size_t>{0, 0, 0, 0}));
  // A long prefill in short chunks runs one of them a turn, leaving the rest of the budget to a
  // hit that arrives meanwhile; so does one that would have fitted alone but not after others.
  const std::vector<PrefillCandidate> g = {{1000, 0, 0, 100}, {60, 1, 0, 30}};
  EXPECT_EQ(Turn(g, 8, 512), (std::vector<size_t>{1, 1, 0}));
  const std::vector<PrefillCandidate> h = {{400, 0, 0, 100}, {200, 1, 0, 200}};
  EXPECT_EQ(Turn(h, 8, 512), (std::vector<size_t>{1, 0}));
}

TEST(PrefillOrder, AJobThatArrivesDuringATurnJoinsItWhileTheBudgetLasts) {
  // A hit's suffix ran (40 rows); a job admitted after it, with a 30-row suffix, is next.
  const std::vector<PrefillCandidate> c = {{510, 0, 0, 510}, {30, 5, 0, 30}};
  PrefillTurn turn(3, 512);
  turn.Ran(2, {40, 4, 0, 40});
  EXPECT_EQ(turn.Next(c, 8), 1u);
  // Once the budget is spent it waits for the next turn, where it goes first.
  PrefillTurn spent(3, 512);
  spent.Ran(2, {500, 4, 0, 500});
  EXPECT_FALSE(spent.Next(c, 8).has_value());
  EXPECT_EQ(PrefillTurn(3, 512).Next(c, 8), 1u);
}

// n tokens counting up from `first`.
std::vector<int32_t> Tokens(int32_t first, size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The index of the prefill waited for.
std::optional<size_t> WaitedFor(std::span<const int32_t> prompt, std::string_view tenant_namespace,
                                std::span<const InFlightPrefill> in_flight, size_t min_shared) {
  const std::optional<SharedPrefill> w = SharedPrefillToWaitFor(prompt, tenant_namespace, in_flight, min_shared);
  return w ? std::optional<size_t>(w->index) : std::nullopt;
}

TEST(SharedPrefill, ABurstSharingASystemPromptWaitsForTheFirstPrefill) {
  const std::vector<int32_t> sys = Tokens(1000, 600);
  const std::vector<int32_t> first = Cat(sys, Tokens(5000, 30)), second = Cat(sys, Tokens(6000, 25));
  std::vector<InFlightPrefill> in_flight = {{first, "", 0, 0}};
  EXPECT_EQ(WaitedFor(second, "", in_flight, 64), 0u);
  in_flight[0].pos = 512;  // one chunk in: still computing the shared part
  EXPECT_EQ(WaitedFor(second, "", in_flight, 64), 0u);
  // An exact repeat waits too (it is then answered from the decoded result).
  EXPECT_EQ(WaitedFor(first, "", in_flight, 64), 0u);
}

TEST(SharedPrefill, NoWaitWithoutEnoughToGain) {
  const std::vector<int32_t> sys = Tokens(1000, 600);
  const std::vector<int32_t> first = Cat(sys, Tokens(5000, 30)), second = Cat(sys, Tokens(6000, 25));
  // Another namespace cannot restore what the first records.
  EXPECT_FALSE(SharedPrefillToWaitFor(second, "tenant-b", std::vector<InFlightPrefill>{{first, "tenant-a", 0, 0}}, 64));
  // The first restored the shared part itself: the second restores it now as well.
  EXPECT_FALSE(SharedPrefillToWaitFor(second, "", std::vector<InFlightPrefill>{{first, "", 600, 600}}, 64));
  // 40 tokens beyond what the first restored, below min_shared.
  EXPECT_FALSE(SharedPrefillToWaitFor(second, "", std::vector<InFlightPrefill>{{first, "", 560, 560}}, 64));
  // Nothing shared.
  EXPECT_FALSE(SharedPrefillToWaitFor(Tokens(9000, 600), "", std::vector<InFlightPrefill>{{first, "", 0, 0}}, 64));
}

TEST(SharedPrefill, NoWaitForALongerPrefillThanTheJobsOwn) {
  // 100 tokens shared with a 2,100-token prompt just begun: the job alone (400 tokens) would be
  // done long before that prefill is; waiting would cost it more than the two save.
  const std::vector<int32_t> sys = Tokens(1000, 100);
  const std::vector<int32_t> longer = Cat(sys, Tokens(5000, 2000)), job = Cat(sys, Tokens(9000, 300));
  std::vector<InFlightPrefill> in_flight = {{longer, "", 0, 0}};
  EXPECT_FALSE(SharedPrefillToWaitFor(job, "", in_flight, 64));
  in_flight[0].pos = 1599;  // 501 left: more than the job's 400 plus the 100 it would save
  EXPECT_FALSE(SharedPrefillToWaitFor(job, "", in_flight, 64));
  in_flight[0].pos = 1600;  // 500 left: it waits
  EXPECT_EQ(WaitedFor(job, "", in_flight, 64), 0u);
}

TEST(SharedPrefill, WaitsForThePrefillSharingTheMost) {
  const std::vector<int32_t> doc = Tokens(1000, 800);
  const std::vector<int32_t> job = Cat(doc, Tokens(7000, 20));
  const std::vector<int32_t> a = Cat(std::vector<int32_t>(doc.begin(), doc.begin() + 300), Tokens(5000, 500));
  const std::vector<int32_t> b = Cat(doc, Tokens(6000, 10));
  const std::vector<InFlightPrefill> in_flight = {{a, "", 0, 0}, {b, "", 0, 0}};
  const std::optional<SharedPrefill> w = SharedPrefillToWaitFor(job, "", in_flight, 64);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->index, 1u);
  EXPECT_EQ(w->shared, doc.size());
  // A prefill whose first token is out (nothing left) is no longer waited for.
  EXPECT_FALSE(SharedPrefillToWaitFor(job, "", std::vector<InFlightPrefill>{{b, "", 0, b.size()}}, 64));
}

TEST(SharedPrefill, DecidesOnWhatThePrefillWillRecord) {
  const std::vector<int32_t> sys = Tokens(1000, 600);
  const std::vector<int32_t> first = Cat(sys, Tokens(5000, 30)), second = Cat(sys, Tokens(6000, 25));
  const std::vector<InFlightPrefill> in_flight = {{first, "", 0, 256}};
  // The lane in flight can record no more than its planned 256 (a cut at 600 would cost one of
  // its records) and has recorded them already: nothing to wait for.
  auto recorded_256 = [](size_t, size_t) { return SharedRestore{256, 256}; };
  EXPECT_FALSE(SharedPrefillToWaitFor(second, "", in_flight, 64, recorded_256));
  // It will record 512 once its first token is out: 256 more than the job restores now.
  auto later_512 = [](size_t, size_t) { return SharedRestore{256, 512}; };
  const std::optional<SharedPrefill> w = SharedPrefillToWaitFor(second, "", in_flight, 64, later_512);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->shared, sys.size());
  EXPECT_EQ(w->restore, 512u);
  // It records nothing (a prompt shorter than the smallest batch, the cache off).
  auto nothing = [](size_t, size_t) { return SharedRestore{}; };
  EXPECT_FALSE(SharedPrefillToWaitFor(second, "", in_flight, 64, nothing));
  // Of two prefills, the one whose records serve more, not the one sharing more.
  const std::vector<int32_t> other = Cat(std::vector<int32_t>(sys.begin(), sys.begin() + 500), Tokens(7000, 40));
  const std::vector<InFlightPrefill> two = {{first, "", 0, 0}, {other, "", 0, 0}};
  auto by_lane = [](size_t i, size_t shared) { return i == 0 ? SharedRestore{0, 128} : SharedRestore{0, shared}; };
  const std::optional<SharedPrefill> best = SharedPrefillToWaitFor(second, "", two, 64, by_lane);
  ASSERT_TRUE(best);
  EXPECT_EQ(best->index, 1u);
  EXPECT_EQ(best->restore, 500u);
}

// A chunk joins a turn's group where one graph for both lowers the summed waits (bench Llama
// Q4_K_M on two cores: a graph reads the weights in ~9 ms, a row computes in ~0.8 ms).
TEST(ChunkGroup, JoinsWhereOneGraphLowersTheWaits) {
  const ChunkGroupCosts costs{9.0, 0.8};
  // Nobody's first token waits for a group of middle chunks: any chunk joins, costs known or not.
  EXPECT_TRUE(JoinsChunkGroup(0, 256, 200, 0, costs));
  EXPECT_TRUE(JoinsChunkGroup(0, 8, 500, 0, ChunkGroupCosts{}));
  // Two suffixes of 4 rows: one graph takes what each takes alone.
  EXPECT_TRUE(JoinsChunkGroup(1, 4, 4, 0, costs));
  // Of 10 rows each: the first would wait 7 ms more for the second's token 2 ms earlier.
  EXPECT_FALSE(JoinsChunkGroup(1, 10, 10, 0, costs));
  // Of 24 rows each, compute-bound: nothing saved, the first waits 19 ms more.
  EXPECT_FALSE(JoinsChunkGroup(1, 24, 24, 4, costs));
  // 6 rows beside 8: 6.8 ms saved to it and two waiting lanes against 2.2 ms more for the first.
  EXPECT_TRUE(JoinsChunkGroup(1, 8, 6, 2, costs));
  // With four first tokens in the group, 8.8 ms of waiting against 6.8 saved.
  EXPECT_FALSE(JoinsChunkGroup(4, 8, 6, 0, costs));
  // A long cold chunk does not join a hit's suffix, even with lanes waiting.
  EXPECT_FALSE(JoinsChunkGroup(1, 10, 480, 4, costs));
  // A cost not measured yet (no prefill so far): only the free joins.
  EXPECT_FALSE(JoinsChunkGroup(1, 2, 2, 8, ChunkGroupCosts{}));
  EXPECT_FALSE(JoinsChunkGroup(1, 2, 2, 8, ChunkGroupCosts{9.0, 0}));
}

}  // namespace
}  // namespace skippy::server
