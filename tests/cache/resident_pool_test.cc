#include "skippy/cache/resident_pool.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace skippy::cache {
namespace {

using testing::MakeScope;
using testing::Range;
using testing::Seq;

ResidentPoolOptions SmallPool(size_t entries = 4, uint64_t bytes = 1000, size_t tokens = 1000) {
  ResidentPoolOptions o;
  o.max_entries = entries;
  o.max_bytes = bytes;
  o.max_tokens = tokens;
  o.lane_count = 2;
  o.seq_id_begin = 2;
  o.seq_id_end = 2 + static_cast<int32_t>(entries);
  return o;
}

std::unique_ptr<ResidentPool> Make(const ResidentPoolOptions& o) {
  auto p = ResidentPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

RecordRequest Req(uint64_t bytes = 10, double cost = 1.0) { return {PayloadKind::kResidentKv, bytes, cost, true}; }

EntryId Record(ResidentPool& pool, const PrefixScope& s, const std::vector<Token>& t, RecordRequest req = Req()) {
  auto r = pool.Reserve(s, t, req);
  EXPECT_TRUE(r.ok()) << r.status();
  auto id = pool.Commit(r->id);
  EXPECT_TRUE(id.ok()) << id.status();
  return *id;
}

TEST(ResidentPool, SequenceRangeMustNotCollideWithLanes) {
  ResidentPoolOptions o = SmallPool();
  o.lane_count = 4;
  o.seq_id_begin = 3;
  auto p = ResidentPool::Create(o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("collide"), std::string_view::npos);
}

TEST(ResidentPool, HandsOutSequenceIdsFromItsRange) {
  auto pool = Make(SmallPool(3));
  auto s = MakeScope();
  std::set<int32_t> seen;
  for (Token t = 0; t < 3; ++t) {
    auto r = pool->Reserve(s, Seq({t}), Req());
    ASSERT_TRUE(r.ok());
    EXPECT_GE(r->seq_id, 2);
    EXPECT_LT(r->seq_id, 5);
    EXPECT_TRUE(seen.insert(r->seq_id).second);
  }
  EXPECT_EQ(pool->Stats().free_sequences, 0u);
}

TEST(ResidentPool, ReserveCommitMakesEntryFindable) {
  auto pool = Make(SmallPool());
  auto s = MakeScope();
  auto r = pool->Reserve(s, Range(0, 16), Req());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(pool->Lookup(s, Range(0, 16), false).hit());  // not findable before Commit
  auto id = pool->Commit(r->id);
  ASSERT_TRUE(id.ok());
  LookupResult hit = pool->Lookup(s, Range(0, 16), false);
  ASSERT_TRUE(hit.hit());
  EXPECT_EQ(hit.match->entry.desc.seq_id, r->seq_id);
}

TEST(ResidentPool, AbortReturnsCapacityAndSequence) {
  auto pool = Make(SmallPool(1));
  auto s = MakeScope();
  auto r = pool->Reserve(s, Range(0, 16), Req());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(pool->Reserve(s, Range(1, 16), Req()).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(pool->Abort(r->id).ok());
  EXPECT_EQ(pool->Abort(r->id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(pool->Reserve(s, Range(1, 16), Req()).ok());
}

TEST(ResidentPool, EvictionsAreReturnedToTheCallerInLruOrder) {
  auto pool = Make(SmallPool(2));
  auto s = MakeScope();
  EntryId a = Record(*pool, s, Seq({1}));
  EntryId b = Record(*pool, s, Seq({2}));
  ASSERT_TRUE(pool->Lookup(s, Seq({1}), false).hit());  // b is now least recently used
  auto r = pool->Reserve(s, Seq({3}), Req());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->evictions.size(), 1u);
  EXPECT_EQ(r->evictions[0].id, b);
  EXPECT_EQ(r->seq_id, r->evictions[0].desc.seq_id);  // the freed sequence is reused
  EXPECT_TRUE(pool->index().IsLive(a));
  EXPECT_EQ(pool->Lookup(s, Seq({2}), false).miss_reason, MissReason::kEvicted);
}

TEST(ResidentPool, PinnedEntriesAreNeverEvicted) {
  auto pool = Make(SmallPool(2));
  auto s = MakeScope();
  EntryId a = Record(*pool, s, Seq({1}));
  EntryId b = Record(*pool, s, Seq({2}));
  ASSERT_TRUE(pool->Pin(a).ok());
  ASSERT_TRUE(pool->Pin(b).ok());
  auto r = pool->Reserve(s, Seq({3}), Req());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  PoolStats st = pool->Stats();
  EXPECT_EQ(st.index.entries, 2u);
  EXPECT_EQ(st.reserved_entries, 0u);
  ASSERT_TRUE(pool->Release(b).ok());
  r = pool->Reserve(s, Seq({3}), Req());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->evictions.size(), 1u);
  EXPECT_EQ(r->evictions[0].id, b);
  EXPECT_TRUE(pool->index().IsLive(a));
}

TEST(ResidentPool, ByteAndTokenCapsEvictUntilTheEntryFits) {
  auto pool = Make(SmallPool(10, 100, 30));
  auto s = MakeScope();
  Record(*pool, s, Range(0, 10), Req(40));
  Record(*pool, s, Range(10, 20), Req(40));
  auto r = pool->Reserve(s, Range(20, 30), Req(50));  // bytes: 80 + 50 > 100: one eviction
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->evictions.size(), 1u);
  ASSERT_TRUE(pool->Commit(r->id).ok());
  r = pool->Reserve(s, Range(30, 55), Req(1));  // tokens: 20 + 25 > 30: evict both
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->evictions.size(), 2u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(ResidentPool, EntryLargerThanWholeCapIsRefusedWithoutChanges) {
  auto pool = Make(SmallPool(4, 100, 50));
  auto s = MakeScope();
  Record(*pool, s, Seq({1}));
  PoolStats before = pool->Stats();
  auto r = pool->Reserve(s, Seq({2}), Req(101));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("larger than the whole"), std::string_view::npos);
  r = pool->Reserve(s, Range(0, 51), Req(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  PoolStats after = pool->Stats();
  EXPECT_EQ(before.used_bytes, after.used_bytes);
  EXPECT_EQ(before.index.entries, after.index.entries);
  EXPECT_EQ(after.index.evictions, 0u);
}

TEST(ResidentPool, BadTokensAreRefused) {
  auto pool = Make(SmallPool());
  auto s = MakeScope("", 100);
  EXPECT_EQ(pool->Reserve(s, {}, Req()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Reserve(s, Seq({1, 100}), Req()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Stats().used_entries, 0u);
}

TEST(ResidentPool, DuplicateRecordIsRefused) {
  auto pool = Make(SmallPool());
  auto s = MakeScope();
  auto r = pool->Reserve(s, Seq({1, 2}), Req());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(pool->Reserve(s, Seq({1, 2}), Req()).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool->Commit(r->id).ok());
  EXPECT_EQ(pool->Reserve(s, Seq({1, 2}), Req()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ResidentPool, DoubleReleaseIsAnErrorAndAccountingUnchanged) {
  auto pool = Make(SmallPool());
  auto s = MakeScope();
  EntryId a = Record(*pool, s, Seq({1}));
  LookupResult r = pool->Lookup(s, Seq({1}), true);
  ASSERT_TRUE(r.hit());
  ASSERT_TRUE(pool->Release(a).ok());
  PoolStats before = pool->Stats();
  EXPECT_EQ(pool->Release(a).status().code(), absl::StatusCode::kFailedPrecondition);
  PoolStats after = pool->Stats();
  EXPECT_EQ(before.used_entries, after.used_entries);
  EXPECT_EQ(before.used_bytes, after.used_bytes);
  EXPECT_EQ(before.free_sequences, after.free_sequences);
}

TEST(ResidentPool, ErasedPinnedEntryKeepsItsSequenceUntilReleased) {
  auto pool = Make(SmallPool(1));
  auto s = MakeScope();
  EntryId a = Record(*pool, s, Seq({1}));
  ASSERT_TRUE(pool->Pin(a).ok());
  auto erased = pool->Erase(a);
  ASSERT_TRUE(erased.ok());
  EXPECT_FALSE(erased->has_value());
  EXPECT_EQ(pool->Stats().free_sequences, 0u);
  EXPECT_EQ(pool->Reserve(s, Seq({2}), Req()).status().code(), absl::StatusCode::kResourceExhausted);
  auto freed = pool->Release(a);
  ASSERT_TRUE(freed.ok());
  ASSERT_TRUE(freed->has_value());
  EXPECT_EQ(pool->Stats().free_sequences, 1u);
  EXPECT_TRUE(pool->Reserve(s, Seq({2}), Req()).ok());
}

TEST(ResidentPool, PayloadEntriesNeedNoSequence) {
  auto pool = Make(SmallPool(1));
  auto s = MakeScope();
  RecordRequest req{PayloadKind::kKvRecurrent, 10, 1.0, /*needs_sequence=*/false};
  auto r = pool->Reserve(s, Seq({1}), req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->seq_id, kNoSequence);
  auto id = pool->Commit(r->id, /*payload_id=*/42);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(pool->index().Find(*id)->desc.payload_id, 42u);
  EXPECT_EQ(pool->Stats().free_sequences, 1u);
}

TEST(ResidentPool, TokenCapBindsOnlyEntriesHoldingASequence) {
  // 100 resident tokens at most; an entry whose payload lives in the payload store holds none.
  auto pool = Make(SmallPool(/*entries=*/8, /*bytes=*/1000, /*tokens=*/100));
  auto s = MakeScope();
  RecordRequest stored = Req();
  stored.needs_sequence = false;
  const EntryId big_stored = Record(*pool, s, Range(800, 890), stored);  // 90 tokens, no sequence
  const EntryId resident = Record(*pool, s, Range(0, 60));
  EXPECT_EQ(pool->Stats().resident_tokens, 60u);
  // A second 60-token resident entry exceeds the token cap: the resident one goes, not the older
  // stored one (evicting it would not free a single resident token).
  auto r = pool->Reserve(s, Range(100, 160), Req());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->evictions.size(), 1u);
  EXPECT_EQ(r->evictions[0].id, resident);
  ASSERT_TRUE(pool->Commit(r->id).ok());
  EXPECT_TRUE(pool->Lookup(s, Range(800, 890), false).hit());
  EXPECT_EQ(pool->Lookup(s, Range(800, 890), false).match->entry.id, big_stored);
  // An entry without a sequence may be longer than the token cap.
  EXPECT_TRUE(pool->Reserve(s, Range(200, 400), stored).ok());
  EXPECT_EQ(pool->Reserve(s, Range(400, 600), Req()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
}

TEST(ResidentPool, PoolWithoutSequencesStoresPayloadsOnly) {
  ResidentPoolOptions o = SmallPool();
  o.seq_id_end = o.seq_id_begin;  // no resident tier
  auto pool = Make(o);
  auto s = MakeScope();
  RecordRequest stored = Req();
  stored.needs_sequence = false;
  const EntryId a = Record(*pool, s, Range(0, 40), stored);
  // Asking for a sequence fails at once and evicts nothing.
  EXPECT_EQ(pool->Reserve(s, Range(100, 140), Req()).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool->Lookup(s, Range(0, 40), false).hit());
  EXPECT_EQ(pool->Lookup(s, Range(0, 40), false).match->entry.id, a);
  EXPECT_EQ(pool->Stats().free_sequences, 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  o.seq_id_end = o.seq_id_begin - 1;
  EXPECT_EQ(ResidentPool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace skippy::cache
