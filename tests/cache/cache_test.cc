#include "skippy/cache/cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "test_util.h"

namespace skippy::cache {
namespace {

using testing::MakeScope;
using testing::Range;
using testing::Seq;

CacheOptions Options(size_t entries) {
  CacheOptions o;
  o.pool.max_entries = entries;
  o.pool.max_bytes = 1 << 30;
  o.pool.max_tokens = 1 << 20;
  o.pool.lane_count = 4;
  o.pool.seq_id_begin = 4;
  o.pool.seq_id_end = 4 + static_cast<int32_t>(entries);
  return o;
}

TEST(Cache, LaneFlowLookupReleaseReserveCommit) {
  auto cache = std::move(*Cache::Create(Options(4)));
  auto s = MakeScope();
  auto miss = cache->Lookup(s, Range(0, 64));
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->hit());
  auto res = cache->Reserve(s, Range(0, 64), {PayloadKind::kResidentKv, 64 * 100, 5.0, true});
  ASSERT_TRUE(res.ok());
  EXPECT_GE(res->seq_id, 4);
  ASSERT_TRUE(cache->Commit(res->id).ok());
  std::vector<Token> next = Range(0, 48);
  next.push_back(999);
  auto hit = cache->Lookup(s, next);
  ASSERT_TRUE(hit.ok() && hit->hit());
  EXPECT_EQ(hit->match->usable_tokens, 48u);
  EXPECT_EQ(hit->match->entry.desc.seq_id, res->seq_id);
  EXPECT_EQ(cache->Stats().pool.index.pinned_entries, 1u);
  auto freed = cache->Release(hit->match->entry.id);
  ASSERT_TRUE(freed.ok());
  EXPECT_FALSE(freed->has_value());
  EXPECT_EQ(cache->Stats().pool.index.pinned_entries, 0u);
}

TEST(Cache, BadInputLeavesCountersUnchanged) {
  auto cache = std::move(*Cache::Create(Options(4)));
  auto s = MakeScope("", 100);
  EXPECT_EQ(cache->Lookup(s, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Lookup(s, Seq({5, 100})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Reserve(s, Seq({-3}), {}).status().code(), absl::StatusCode::kInvalidArgument);
  CacheStats st = cache->Stats();
  EXPECT_EQ(st.pool.index.hits + st.pool.index.misses, 0u);
  EXPECT_EQ(st.pool.used_entries, 0u);
  EXPECT_EQ(cache->Release(12345).status().code(), absl::StatusCode::kNotFound);
}

TEST(Cache, DecodedResultAnswersExactRepeat) {
  auto cache = std::move(*Cache::Create(Options(4)));
  auto s = MakeScope("", 3);
  ASSERT_TRUE(cache->PutDecoded(s, Seq({0, 1, 2}), {1.f, 2.f, 3.f}).ok());
  auto r = cache->GetDecoded(s, Seq({0, 1, 2}));
  ASSERT_TRUE(r.ok());
  ASSERT_NE(*r, nullptr);
  EXPECT_EQ((*r)->logits[2], 3.f);
  EXPECT_EQ(*cache->GetDecoded(s, Seq({0, 1})), nullptr);
}

// Several lanes hammer one cache; every pinned hit must stay valid (never evicted, never freed)
// until released, caps must hold, and the invariants must hold at the end.
TEST(Cache, ConcurrentLanesNeverLosePinnedEntries) {
  constexpr int kLanes = 4;
  auto cache = std::move(*Cache::Create(Options(8)));
  auto s = MakeScope("", 16);
  std::atomic<int> failures{0};
  std::mutex tracker_mu;
  std::multiset<EntryId> pinned;  // ids some lane holds a pin on (removed before Release)
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < kLanes; ++lane) {
    lanes.emplace_back([&, lane] {
      std::mt19937 rng(lane);
      for (int i = 0; i < 3000; ++i) {
        std::vector<Token> prompt(1 + rng() % 12);
        for (auto& t : prompt) t = static_cast<Token>(rng() % 4);
        auto r = cache->Lookup(s, prompt);
        if (!r.ok()) { ++failures; continue; }
        if (r->hit()) {
          // While pinned, no concurrent Reserve may hand this entry out as evicted.
          EntryId id = r->match->entry.id;
          {
            std::lock_guard lock(tracker_mu);
            pinned.insert(id);
          }
          auto peek = cache->Peek(s, prompt);
          if (!peek.ok() || !peek->hit()) ++failures;  // a pinned entry cannot vanish
          {
            std::lock_guard lock(tracker_mu);
            pinned.erase(pinned.find(id));
          }
          auto freed = cache->Release(id);
          if (!freed.ok()) ++failures;
        }
        auto res = cache->Reserve(s, prompt, {PayloadKind::kResidentKv, 10, 1.0, true});
        if (res.ok()) {
          {
            std::lock_guard lock(tracker_mu);
            for (const EntryInfo& e : res->evictions) {
              if (pinned.count(e.id)) ++failures;
            }
          }
          if (rng() % 4 == 0) {
            if (!cache->Abort(res->id).ok()) ++failures;
          } else if (!cache->Commit(res->id).ok()) {
            ++failures;
          }
        } else if (res.status().code() != absl::StatusCode::kFailedPrecondition &&
                   res.status().code() != absl::StatusCode::kResourceExhausted) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : lanes) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  CacheStats st = cache->Stats();
  EXPECT_LE(st.pool.used_entries, 8u);
  EXPECT_EQ(st.pool.index.pinned_entries, 0u);
  EXPECT_GT(st.pool.index.hits, 0u);
}

}  // namespace
}  // namespace skippy::cache
