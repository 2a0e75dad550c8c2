#include "skippy/cache/radix_index.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace skippy::cache {
namespace {

using testing::MakeScope;
using testing::Range;
using testing::Seq;

EntryDesc Rk(uint64_t bytes = 10) { return {PayloadKind::kResidentKv, bytes, 1, 0, 1.0}; }
EntryDesc Kr(uint64_t bytes = 10) { return {PayloadKind::kKvRecurrent, bytes, kNoSequence, 7, 1.0}; }

TEST(RadixIndex, ExactHitReturnsEntry) {
  RadixIndex idx;
  auto s = MakeScope();
  auto id = idx.Insert(s, Seq({1, 2, 3}), Rk());
  ASSERT_TRUE(id.ok());
  LookupResult r = idx.Lookup(s, Seq({1, 2, 3}), false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->entry.id, *id);
  EXPECT_EQ(r.match->usable_tokens, 3u);
  EXPECT_TRUE(r.match->exact_boundary);
}

TEST(RadixIndex, LongestPrefixServesShorterAttentionPrefix) {
  RadixIndex idx;
  auto s = MakeScope();
  auto id = idx.Insert(s, Range(0, 100), Rk());
  ASSERT_TRUE(id.ok());
  // A request sharing 40 tokens, then diverging.
  std::vector<Token> q = Range(0, 40);
  q.push_back(999);
  LookupResult r = idx.Lookup(s, q, false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 40u);
  EXPECT_FALSE(r.match->exact_boundary);
  EXPECT_EQ(r.match->entry.tokens, 100u);
  // A request that is a strict prefix of the stored sequence.
  r = idx.Lookup(s, Range(0, 7), false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 7u);
}

TEST(RadixIndex, LongerRequestUsesWholeStoredPrefix) {
  RadixIndex idx;
  auto s = MakeScope();
  ASSERT_TRUE(idx.Insert(s, Range(0, 10), Rk()).ok());
  LookupResult r = idx.Lookup(s, Range(0, 50), false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 10u);
  EXPECT_TRUE(r.match->exact_boundary);
}

TEST(RadixIndex, RecurrentOnlyAtExactBoundary) {
  RadixIndex idx;
  auto s = MakeScope();
  ASSERT_TRUE(idx.Insert(s, Range(0, 100), Kr()).ok());
  EXPECT_FALSE(idx.Lookup(s, Range(0, 99), false).hit());  // would need truncation
  std::vector<Token> diverge = Range(0, 100);
  diverge[99] = 500;
  EXPECT_FALSE(idx.Lookup(s, diverge, false).hit());
  LookupResult r = idx.Lookup(s, Range(0, 150), false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 100u);
  EXPECT_EQ(r.match->entry.desc.kind, PayloadKind::kKvRecurrent);
}

// path_tokens: how far a request follows the paths of stored entries, hit or miss. A document
// recorded with one question tells the next request with another question where it branches.
TEST(RadixIndex, PathTokensSayWhereARequestBranchesOff) {
  RadixIndex idx;
  auto s = MakeScope();
  std::vector<Token> q1 = Range(0, 100);  // document [0, 80) + question 1
  ASSERT_TRUE(idx.Insert(s, q1, Kr()).ok());
  ASSERT_TRUE(idx.Insert(s, Range(0, 40), Kr()).ok());
  std::vector<Token> q2 = Range(0, 80);
  for (Token t = 900; t < 930; ++t) q2.push_back(t);  // the same document, question 2
  LookupResult r = idx.Lookup(s, q2, false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 40u);
  EXPECT_EQ(r.path_tokens, 80u) << "branches off q1's path where the questions differ";
  // A miss still reports the path (here inside the first edge).
  std::vector<Token> early = Range(0, 30);
  early.push_back(777);
  LookupResult m = idx.Lookup(s, early, false);
  EXPECT_FALSE(m.hit());
  EXPECT_EQ(m.path_tokens, 30u);
  // A request that follows a path to its end and beyond: the path ends with the entry.
  EXPECT_EQ(idx.Lookup(s, Range(0, 150), false).path_tokens, 100u);
  EXPECT_EQ(idx.Lookup(s, Seq({5000, 1}), false).path_tokens, 0u);
  EXPECT_EQ(idx.Peek(s, q2).path_tokens, 80u);
}

TEST(RadixIndex, SlidingWindowResidentEntryServesOnlyExactBoundaries) {
  RadixIndex idx;
  auto s = MakeScope();
  EntryDesc swa = Rk();
  swa.exact_only = true;
  ASSERT_TRUE(idx.Insert(s, Range(0, 64), swa).ok());
  ASSERT_TRUE(idx.Insert(s, Range(0, 128), swa).ok());
  // A plain resident entry of 128 would serve 100 tokens; a sliding-window one serves the deepest
  // exact boundary inside the request instead.
  LookupResult r = idx.Lookup(s, Range(0, 100), false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 64u);
  EXPECT_TRUE(r.match->exact_boundary);
  EXPECT_FALSE(idx.Lookup(s, Range(0, 63), false).hit());
  r = idx.Lookup(s, Range(0, 200), false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 128u);
  EXPECT_TRUE(idx.CheckInvariants().ok());
}

TEST(RadixIndex, RecurrentPicksDeepestRecordedBoundary) {
  RadixIndex idx;
  auto s = MakeScope();
  ASSERT_TRUE(idx.Insert(s, Range(0, 32), Kr()).ok());
  ASSERT_TRUE(idx.Insert(s, Range(0, 64), Kr()).ok());
  ASSERT_TRUE(idx.Insert(s, Range(0, 96), Kr()).ok());
  LookupResult r = idx.Lookup(s, Range(0, 80), false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 64u);
}

TEST(RadixIndex, ExactBoundaryWinsTieOverDescendant) {
  RadixIndex idx;
  auto s = MakeScope();
  ASSERT_TRUE(idx.Insert(s, Range(0, 20), Rk()).ok());
  auto kr = idx.Insert(s, Range(0, 10), Kr());
  ASSERT_TRUE(kr.ok());
  std::vector<Token> q = Range(0, 10);
  q.push_back(777);
  LookupResult r = idx.Lookup(s, q, false);
  ASSERT_TRUE(r.hit());
  EXPECT_EQ(r.match->usable_tokens, 10u);
  EXPECT_EQ(r.match->entry.id, *kr);
}

TEST(RadixIndex, NamespacesAreIsolated) {
  RadixIndex idx;
  ASSERT_TRUE(idx.Insert(MakeScope("tenant-a"), Range(0, 10), Rk()).ok());
  LookupResult r = idx.Lookup(MakeScope("tenant-b"), Range(0, 10), false);
  EXPECT_FALSE(r.hit());
  // Tenant B learns nothing from the miss reason: the same answer as for a prompt nobody sent.
  EXPECT_EQ(r.miss_reason, MissReason::kNeverSeen);
  EXPECT_EQ(r.path_tokens, 0u);
}

TEST(RadixIndex, MissReasonsAreCounted) {
  RadixIndex idx;
  auto s = MakeScope();
  auto id = idx.Insert(s, Range(0, 10), Rk());
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(idx.Lookup(s, Seq({500, 501}), false).miss_reason, MissReason::kNeverSeen);
  auto other = MakeScope();
  other.config.type_k = "q8_0";
  EXPECT_EQ(idx.Lookup(other, Range(0, 10), false).miss_reason, MissReason::kIdentityMismatch);
  ASSERT_TRUE(idx.Erase(*id, /*evicted=*/true).ok());
  EXPECT_EQ(idx.Lookup(s, Range(0, 5), false).miss_reason, MissReason::kEvicted);
  RadixStats st = idx.Stats();
  EXPECT_EQ(st.misses, 3u);
  EXPECT_EQ(st.miss_never_seen, 1u);
  EXPECT_EQ(st.miss_identity_mismatch, 1u);
  EXPECT_EQ(st.miss_evicted, 1u);
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.hits, 0u);
}

TEST(RadixIndex, PeekDoesNotTouchRecencyOrStats) {
  RadixIndex idx;
  auto s = MakeScope();
  auto a = idx.Insert(s, Seq({1}), Rk());
  auto b = idx.Insert(s, Seq({2}), Rk());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(idx.Peek(s, Seq({1})).hit());
  EntryId first = 0;
  idx.ForEachEvictable([&](const EntryInfo& e) {
    first = e.id;
    return false;
  });
  EXPECT_EQ(first, *a);  // still least recently used
  EXPECT_EQ(idx.Stats().hits, 0u);
  EXPECT_TRUE(idx.Lookup(s, Seq({1}), false).hit());
  idx.ForEachEvictable([&](const EntryInfo& e) {
    first = e.id;
    return false;
  });
  EXPECT_EQ(first, *b);
}

TEST(RadixIndex, PinnedEntryIsNotEvictableAndErasedEntryLivesUntilRelease) {
  RadixIndex idx;
  auto s = MakeScope();
  auto id = idx.Insert(s, Range(0, 8), Rk());
  ASSERT_TRUE(id.ok());
  LookupResult r = idx.Lookup(s, Range(0, 8), /*pin=*/true);
  ASSERT_TRUE(r.hit());
  size_t evictable = 0;
  idx.ForEachEvictable([&](const EntryInfo&) { return ++evictable, true; });
  EXPECT_EQ(evictable, 0u);
  auto erased = idx.Erase(*id, false);
  ASSERT_TRUE(erased.ok());
  EXPECT_FALSE(erased->has_value());  // still pinned
  EXPECT_FALSE(idx.Lookup(s, Range(0, 8), false).hit());
  EXPECT_NE(idx.Find(*id), nullptr);
  EXPECT_EQ(idx.Stats().zombie_entries, 1u);
  auto freed = idx.Unpin(*id);
  ASSERT_TRUE(freed.ok());
  ASSERT_TRUE(freed->has_value());
  EXPECT_EQ((*freed)->id, *id);
  EXPECT_EQ(idx.Find(*id), nullptr);
  EXPECT_EQ(idx.Stats().zombie_entries, 0u);
}

TEST(RadixIndex, DoubleUnpinIsAnErrorAndChangesNothing) {
  RadixIndex idx;
  auto s = MakeScope();
  auto id = idx.Insert(s, Range(0, 8), Rk());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(idx.Pin(*id).ok());
  ASSERT_TRUE(idx.Unpin(*id).ok());
  auto again = idx.Unpin(*id);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(idx.IsLive(*id));
  EXPECT_TRUE(idx.CheckInvariants().ok());
}

TEST(RadixIndex, DuplicateEntryIsRefused) {
  RadixIndex idx;
  auto s = MakeScope();
  ASSERT_TRUE(idx.Insert(s, Range(0, 8), Rk()).ok());
  EXPECT_EQ(idx.Insert(s, Range(0, 8), Rk()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(idx.Insert(s, Range(0, 8), Kr()).ok());  // another kind at the same boundary
}

TEST(RadixIndex, RemovingEntriesMergesNodes) {
  RadixIndex idx;
  auto s = MakeScope();
  auto a = idx.Insert(s, Range(0, 100), Rk());
  auto b = idx.Insert(s, Range(0, 50), Rk());
  std::vector<Token> c_tokens = Range(0, 60);
  c_tokens.push_back(5000 % 1000);
  auto c = idx.Insert(s, c_tokens, Rk());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  RadixStats st = idx.Stats();
  EXPECT_EQ(st.nodes, 4u);  // [0,50) [50,60) [60,100) [60]+[x]
  EXPECT_TRUE(idx.CheckInvariants().ok()) << idx.CheckInvariants();
  ASSERT_TRUE(idx.Erase(*c, false).ok());
  EXPECT_TRUE(idx.CheckInvariants().ok()) << idx.CheckInvariants();
  EXPECT_EQ(idx.Stats().nodes, 2u);
  ASSERT_TRUE(idx.Erase(*b, false).ok());
  EXPECT_EQ(idx.Stats().nodes, 1u);
  EXPECT_EQ(idx.Stats().edge_tokens, 100u);
  EXPECT_TRUE(idx.CheckInvariants().ok()) << idx.CheckInvariants();
  EXPECT_EQ(idx.TokensOf(*a), Range(0, 100));
  ASSERT_TRUE(idx.Erase(*a, false).ok());
  EXPECT_EQ(idx.Stats().nodes, 0u);
  EXPECT_EQ(idx.Stats().entries, 0u);
}

TEST(RadixIndex, StatsCountEntriesTokensBytes) {
  RadixIndex idx;
  auto s = MakeScope();
  ASSERT_TRUE(idx.Insert(s, Range(0, 10), Rk(100)).ok());
  ASSERT_TRUE(idx.Insert(s, Range(0, 20), Rk(200)).ok());
  RadixStats st = idx.Stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.tokens, 30u);
  EXPECT_EQ(st.bytes, 300u);
  EXPECT_EQ(st.edge_tokens, 20u);
  EXPECT_EQ(st.scopes, 1u);
}

TEST(RadixIndex, CostAwareEvictsLeastSavedPerByteFirst) {
  RadixIndex idx({EvictionPolicy::kCostAware});
  auto s = MakeScope();
  auto cheap = idx.Insert(s, Seq({1}), {PayloadKind::kResidentKv, 1000, 1, 0, 1.0});
  auto dear = idx.Insert(s, Seq({2}), {PayloadKind::kResidentKv, 1000, 2, 0, 50.0});
  ASSERT_TRUE(cheap.ok() && dear.ok());
  ASSERT_TRUE(idx.Lookup(s, Seq({1}), false).hit());  // recency alone would evict `dear`
  EntryId first = 0;
  idx.ForEachEvictable([&](const EntryInfo& e) { return first = e.id, false; });
  EXPECT_EQ(first, *cheap);
}

}  // namespace
}  // namespace skippy::cache

namespace skippy::cache {
namespace {

TEST(RadixIndex, GhostMemoryIsBoundedOldestForgottenFirst) {
  RadixIndexOptions o;
  o.max_ghost_entries = 1;
  RadixIndex idx(o);
  auto s = testing::MakeScope();
  auto a = idx.Insert(s, testing::Seq({1, 2}), Rk());
  auto b = idx.Insert(s, testing::Seq({3, 4}), Rk());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(idx.Erase(*a, true).ok());
  ASSERT_TRUE(idx.Erase(*b, true).ok());
  EXPECT_EQ(idx.Stats().ghosts, 1u);
  EXPECT_EQ(idx.Peek(s, testing::Seq({3, 4})).miss_reason, MissReason::kEvicted);
  EXPECT_EQ(idx.Peek(s, testing::Seq({1, 2})).miss_reason, MissReason::kNeverSeen);
  EXPECT_TRUE(idx.CheckInvariants().ok());
}

TEST(RadixIndex, TheGhostOfAnExactOnlyEntryMatchesItsWholeLengthOnly) {
  RadixIndex idx;
  auto s = testing::MakeScope();
  EntryDesc window = Rk();
  window.exact_only = true;  // a sliding-window entry: it never served a shorter prefix
  auto id = idx.Insert(s, testing::Range(0, 100), window);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(idx.Erase(*id, /*evicted=*/true).ok());
  EXPECT_EQ(idx.Peek(s, testing::Range(0, 100)).miss_reason, MissReason::kEvicted);
  // Its first 50 tokens were never served by it: the eviction is not why this misses.
  EXPECT_EQ(idx.Peek(s, testing::Range(0, 50)).miss_reason, MissReason::kNeverSeen);
  EXPECT_TRUE(idx.CheckInvariants().ok());
}

}  // namespace
}  // namespace skippy::cache
