// NextPrefill: which lane's prefill chunk runs next between two steps of the decoding lanes.
// SharedPrefillToWaitFor: whether a job waits for another lane to compute a prefix they share.
#include "skippy/server/prefill_order.h"

#include <gtest/gtest.h>

#include <numeric>
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

}  // namespace
}  // namespace skippy::server
