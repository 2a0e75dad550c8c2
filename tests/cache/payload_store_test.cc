#include "skippy/cache/payload_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>

namespace skippy::cache {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

std::unique_ptr<PayloadStore> Make(size_t block = 1024, uint64_t cap = 1 << 20) {
  auto s = PayloadStore::Create({block, cap, 4});
  EXPECT_TRUE(s.ok());
  return std::move(*s);
}

TEST(PayloadStore, RoundTripsBytesExactly) {
  auto store = Make();
  auto data = Bytes(5000, 1);  // 4 full blocks + a partial one
  auto put = store->Put(data);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->new_blocks, 5u);
  auto got = store->Get(put->id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, data);
  EXPECT_TRUE(store->CheckInvariants().ok());
}

TEST(PayloadStore, ReadRangeCopiesOnlyTheAskedBytes) {
  auto store = Make();
  auto data = Bytes(5000, 2);
  auto put = store->Put(data);
  ASSERT_TRUE(put.ok()) << put.status();
  for (auto [offset, n] : {std::pair<size_t, size_t>{0, 8}, {1000, 100}, {1020, 2000}, {4096, 904}, {5000, 0}, {0, 5000}}) {
    std::vector<std::byte> out(n);
    ASSERT_TRUE(store->ReadRange(put->id, offset, out).ok()) << offset << "+" << n;
    EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + static_cast<std::ptrdiff_t>(offset))) << offset << "+" << n;
  }
  std::vector<std::byte> out(10);
  EXPECT_EQ(store->ReadRange(put->id, 4991, out).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store->ReadRange(put->id, 6000, std::span(out).first(0)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store->ReadRange(put->id + 1, 0, out).code(), absl::StatusCode::kNotFound);
}

TEST(PayloadStore, DuplicateBlocksAreStoredOnce) {
  auto store = Make();
  auto shared = Bytes(3072, 2);
  auto a = shared;
  auto tail_a = Bytes(1024, 3);
  a.insert(a.end(), tail_a.begin(), tail_a.end());
  auto b = shared;
  auto tail_b = Bytes(1024, 4);
  b.insert(b.end(), tail_b.begin(), tail_b.end());
  auto pa = store->Put(a);
  auto pb = store->Put(b);
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(pb->shared_blocks, 3u);
  EXPECT_EQ(pb->new_blocks, 1u);
  PayloadStats st = store->Stats();
  EXPECT_EQ(st.logical_bytes, 8192u);
  EXPECT_EQ(st.physical_bytes, 5120u);
  EXPECT_EQ(st.saved_bytes, 3072u);
  EXPECT_EQ(st.blocks, 5u);
  EXPECT_EQ(*store->Get(pa->id), a);
  EXPECT_EQ(*store->Get(pb->id), b);
}

// Blocks are shared within a dedup domain (a tenant) only: a tenant that stores another tenant's
// bytes pays for them in full, so physical bytes reveal nothing across tenants.
TEST(PayloadStore, BlocksAreSharedWithinADedupDomainOnly) {
  auto store = Make();
  auto data = Bytes(4096, 3);
  auto a1 = store->Put(data, nullptr, /*dedup_domain=*/1);
  ASSERT_TRUE(a1.ok());
  const uint64_t one = store->Stats().physical_bytes;
  auto a2 = store->Put(data, nullptr, 1);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->new_blocks, 0u);
  EXPECT_EQ(store->Stats().physical_bytes, one);
  auto b1 = store->Put(data, nullptr, 2);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(b1->shared_blocks, 0u);
  EXPECT_EQ(store->Stats().physical_bytes, 2 * one);
  EXPECT_EQ(store->Stats().hash_collisions, 0u) << "equal bytes in another domain are no collision";
  EXPECT_EQ(*store->Get(b1->id), data);
  EXPECT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();
}

TEST(PayloadStore, RepeatedBlocksWithinOnePayloadAreStoredOnce) {
  auto store = Make();
  std::vector<std::byte> zeros(4096, std::byte{0});
  auto p = store->Put(zeros);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->new_blocks, 1u);
  EXPECT_EQ(store->Stats().physical_bytes, 1024u);
  EXPECT_EQ(*store->Get(p->id), zeros);
}

TEST(PayloadStore, ReleaseFreesBlocksWhenLastReferenceGoes) {
  auto store = Make();
  auto a = Bytes(2048, 5);
  auto pa = store->Put(a);
  auto pb = store->Put(a);
  ASSERT_TRUE(pa.ok() && pb.ok());
  std::vector<PayloadId> one = {pa->id};
  ASSERT_TRUE(store->Release(one).ok());
  EXPECT_EQ(store->Stats().physical_bytes, 2048u);
  EXPECT_EQ(*store->Get(pb->id), a);
  std::vector<PayloadId> two = {pb->id};
  ASSERT_TRUE(store->Release(two).ok());
  EXPECT_EQ(store->Stats().physical_bytes, 0u);
  EXPECT_EQ(store->Stats().logical_bytes, 0u);
}

TEST(PayloadStore, BatchReleaseIsValidatedBeforeAnythingChanges) {
  auto store = Make();
  auto pa = store->Put(Bytes(100, 6));
  auto pb = store->Put(Bytes(100, 7));
  ASSERT_TRUE(pa.ok() && pb.ok());
  std::vector<PayloadId> first = {pa->id};
  ASSERT_TRUE(store->Release(first).ok());
  PayloadStats before = store->Stats();
  std::vector<PayloadId> batch = {pb->id, pa->id};  // pa was already released
  Status st = store->Release(batch);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("double release"), std::string_view::npos) << st;
  PayloadStats after = store->Stats();
  EXPECT_EQ(before.payloads, after.payloads);
  EXPECT_EQ(before.physical_bytes, after.physical_bytes);
  EXPECT_TRUE(store->Size(pb->id).ok());  // pb survived the failed batch
  std::vector<PayloadId> dup = {pb->id, pb->id};
  EXPECT_EQ(store->Release(dup).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Size(pb->id).ok());
}

// Records the ids the store evicts, as an owner's on_evict would.
struct EvictionLog {
  std::vector<PayloadId> ids;
  PayloadTier::OnEvict Callback() {
    return [this](PayloadId id) { ids.push_back(id); };
  }
};

TEST(PayloadStore, CapEvictsLeastRecentlyUsedUnpinnedPayloads) {
  auto store = Make(1024, 4096);
  EvictionLog log;
  auto p1 = store->Put(Bytes(2048, 1), log.Callback());
  auto p2 = store->Put(Bytes(2048, 2), log.Callback());
  ASSERT_TRUE(p1.ok() && p2.ok());
  std::vector<std::byte> buf(2048);
  ASSERT_TRUE(store->Read(p1->id, buf).ok());  // p2 becomes least recently used
  auto p3 = store->Put(Bytes(2048, 3), log.Callback());
  ASSERT_TRUE(p3.ok());
  EXPECT_EQ(log.ids, std::vector<PayloadId>{p2->id});
  EXPECT_LE(store->Stats().physical_bytes, 4096u);
  EXPECT_EQ(store->Size(p2->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store->Contains(p2->id));
  EXPECT_TRUE(store->Contains(p1->id));
  EXPECT_EQ(store->Usage().evictions, 1u);
  EXPECT_TRUE(store->CheckInvariants().ok());
}

TEST(PayloadStore, EvictionCallbackRunsAfterTheLockAndMayCallTheStore) {
  auto store = Make(1024, 4096);
  PayloadId seen = 0;
  bool contained = true;
  auto owner = [&](PayloadId id) {
    seen = id;
    contained = store->Contains(id);  // would deadlock if called under the store's lock
  };
  auto p1 = store->Put(Bytes(4096, 1), owner);
  ASSERT_TRUE(p1.ok());
  auto p2 = store->Put(Bytes(4096, 2), nullptr);
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(seen, p1->id);
  EXPECT_FALSE(contained);
  // p2 had no callback; its eviction tells nobody. An owner's own Erase does not call back.
  seen = 0;
  auto p3 = store->Put(Bytes(1024, 3), owner);
  ASSERT_TRUE(p3.ok());
  EXPECT_FALSE(store->Contains(p2->id));
  EXPECT_EQ(seen, 0u);
  ASSERT_TRUE(store->Erase(p3->id).ok());
  EXPECT_EQ(seen, 0u);
  EXPECT_EQ(store->Erase(p3->id).code(), absl::StatusCode::kNotFound);
}

TEST(PayloadStore, PinnedPayloadsAreNeverEvicted) {
  auto store = Make(1024, 4096);
  auto p1 = store->Put(Bytes(2048, 1));
  auto p2 = store->Put(Bytes(2048, 2));
  ASSERT_TRUE(p1.ok() && p2.ok());
  ASSERT_TRUE(store->Pin(p1->id).ok());
  ASSERT_TRUE(store->Pin(p2->id).ok());
  PayloadStats before = store->Stats();
  auto p3 = store->Put(Bytes(2048, 3));
  EXPECT_EQ(p3.status().code(), absl::StatusCode::kResourceExhausted);
  PayloadStats after = store->Stats();
  EXPECT_EQ(before.physical_bytes, after.physical_bytes);
  EXPECT_EQ(before.payloads, after.payloads);
  ASSERT_TRUE(store->Unpin(p2->id).ok());
  EXPECT_EQ(store->Unpin(p2->id).code(), absl::StatusCode::kFailedPrecondition);
  EvictionLog log;
  p3 = store->Put(Bytes(2048, 3), log.Callback());
  ASSERT_TRUE(p3.ok());
  EXPECT_TRUE(log.ids.empty()) << "the callback belongs to the evicted payload, not to the Put";
  EXPECT_FALSE(store->Contains(p2->id));
}

TEST(PayloadStore, EvictionNeverFreesBlocksTheNewPayloadShares) {
  auto store = Make(1024, 3072);
  auto shared = Bytes(2048, 9);
  auto p1 = store->Put(shared);
  ASSERT_TRUE(p1.ok());
  auto next = shared;
  auto extra = Bytes(1024, 10);
  next.insert(next.end(), extra.begin(), extra.end());
  auto p2 = store->Put(next);  // 2048 shared + 1024 new = 3072: fits without eviction
  ASSERT_TRUE(p2.ok());
  EXPECT_TRUE(store->Contains(p1->id));
  // Shares block A with p1 and p2; needs one new block. Evicting p1 frees nothing (p2 holds
  // A and B), evicting p2 frees B and C but must keep A for the new payload.
  std::vector<std::byte> again(shared.begin(), shared.begin() + 1024);
  auto fresh = Bytes(1024, 11);
  again.insert(again.end(), fresh.begin(), fresh.end());
  auto p3 = store->Put(again);
  EXPECT_FALSE(store->Contains(p1->id));
  EXPECT_FALSE(store->Contains(p2->id));
  EXPECT_EQ(store->Stats().physical_bytes, 2048u);
  ASSERT_TRUE(p3.ok()) << p3.status();
  EXPECT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();
  EXPECT_EQ(*store->Get(p3->id), again);
}

TEST(PayloadStore, PayloadLargerThanWholeCapIsRefused) {
  auto store = Make(1024, 2048);
  auto p = store->Put(Bytes(4096, 1));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("larger than the whole"), std::string_view::npos);
  EXPECT_EQ(store->Stats().payloads, 0u);
  EXPECT_EQ(store->Put({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PayloadStore, ReleasedPinnedPayloadStaysReadableUntilUnpinned) {
  auto store = Make();
  auto data = Bytes(3000, 12);
  auto p = store->Put(data);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(store->Pin(p->id).ok());
  std::vector<PayloadId> ids = {p->id};
  ASSERT_TRUE(store->Release(ids).ok());
  EXPECT_EQ(*store->Get(p->id), data);
  EXPECT_EQ(store->Release(ids).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Unpin(p->id).ok());
  EXPECT_EQ(store->Size(p->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().physical_bytes, 0u);
}

TEST(PayloadStore, BlockDigestsIncludeSha256OnRequest) {
  auto store = Make();
  auto p = store->Put(Bytes(1500, 13));
  ASSERT_TRUE(p.ok());
  auto fast = store->BlockDigests(p->id, false);
  auto full = store->BlockDigests(p->id, true);
  ASSERT_TRUE(fast.ok() && full.ok());
  ASSERT_EQ(full->size(), 2u);
  EXPECT_EQ((*full)[1].size, 476u);
  EXPECT_EQ((*fast)[0].sha256, Sha256Digest{});
  EXPECT_NE((*full)[0].sha256, Sha256Digest{});
  EXPECT_EQ((*fast)[0].xxh3_128, (*full)[0].xxh3_128);
}

TEST(PayloadStore, ReadChecksBufferSize) {
  auto store = Make();
  auto p = store->Put(Bytes(100, 14));
  ASSERT_TRUE(p.ok());
  std::vector<std::byte> small(99);
  EXPECT_EQ(store->Read(p->id, small).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace skippy::cache

#include <thread>

namespace skippy::cache {
namespace {

TEST(PayloadStore, ConcurrentPutsAndReleasesKeepAccountingExact) {
  auto store = Make(256, 1 << 16);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        auto data = Bytes(256 * (1 + i % 4), static_cast<uint8_t>((t * 7 + i) % 5));  // much sharing
        auto put = store->Put(data);
        if (!put.ok()) continue;  // evicted by another thread's Put or the cap: both fine
        auto got = store->Get(put->id);
        if (got.ok() && *got != data) ++failures;  // a readable payload must be exact
        std::vector<PayloadId> ids = {put->id};
        Status st = store->Release(ids);
        if (!st.ok() && st.code() != absl::StatusCode::kNotFound) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();
  EXPECT_LE(store->Stats().physical_bytes, uint64_t{1} << 16);
}

}  // namespace
}  // namespace skippy::cache
