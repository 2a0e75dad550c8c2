// SharedTier against a real redis-server (started here on a loopback port, with a password): two
// replicas see each other's entries (at open and through events), every read is verified, nothing
// that fails a check is served, tenants and identities stay apart, and a Redis that is down,
// paused or restarted makes reads miss quickly and never fail a caller.
#include "skippy/cache/shared_tier.h"

#include <chrono>
#include <random>

#include <gtest/gtest.h>

#include "../support/redis_server.h"
#include "test_util.h"

namespace skippy::cache {
namespace {

using skippy::testing::RedisServer;
using testing::MakeScope;
using testing::Range;
using Clock = std::chrono::steady_clock;

// The prefix length a lookup serves (0 on a miss), so a miss fails an expectation instead of
// dereferencing an empty optional.
size_t Usable(PrefixTier& t, const std::vector<Token>& tokens) {
  const auto hit = t.Lookup("", tokens);
  return hit ? hit->usable_tokens : 0;
}

class SharedTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_ = RedisServer::Start();
    ASSERT_NE(redis_, nullptr);
  }

  // A generous deadline by default (a loaded CI machine must not turn writes into drops); the
  // fault test sets a short one.
  SharedTierOptions Options(uint32_t timeout_ms = 5000) const {
    SharedTierOptions o;
    o.port = redis_->port();
    o.password = RedisServer::kPassword;
    o.block_bytes = 4096;  // several blocks per test payload
    o.timeout_ms = timeout_ms;
    o.retry_ms = 100;
    return o;
  }
  std::unique_ptr<SharedTier> Open(const CacheConfigIdentity& id = MakeScope().config, uint32_t timeout_ms = 5000) {
    auto t = SharedTier::Open(Options(timeout_ms), id);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  static PrefixRecord Record(std::vector<Token> tokens, PayloadKind kind = PayloadKind::kResidentKv, std::string ns = "") {
    PrefixRecord r;
    r.tenant_namespace = std::move(ns);
    r.kind = kind;
    r.classes = BatchClasses::Of(tokens.size(), {}, 32);
    r.tokens = std::move(tokens);
    return r;
  }
  static std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
    std::vector<uint8_t> b(n);
    std::mt19937 rng(seed);
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    return b;
  }
  std::vector<std::string> BlockKeys() const { return redis_->Keys("skippy:b:*"); }

  std::unique_ptr<RedisServer> redis_;
};

TEST_F(SharedTierTest, AReplicaOpenedLaterFindsEntriesAndReadsThemBackExactly) {
  const auto bytes = Bytes(10000, 1);  // 3 blocks
  auto a = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 100)), bytes));
  a->Flush();
  EXPECT_EQ(a->Stats().writes, 1u);
  EXPECT_EQ(a->Stats().blocks_written, 3u);
  auto b = Open();
  EXPECT_EQ(b->Stats().loaded_at_open, 1u);
  auto hit = b->Lookup("", Range(0, 120));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->usable_tokens, 100u);
  EXPECT_EQ(hit->record.tokens, Range(0, 100));
  auto got = b->Read(*hit);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  EXPECT_EQ(b->Stats().hits, 1u);
}

TEST_F(SharedTierTest, ARunningReplicaLearnsNewEntriesFromEvents) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 50)), Bytes(5000, 2)));
  ASSERT_TRUE(b->WaitForEntries(1, 5000));
  auto hit = b->Lookup("", Range(0, 50));
  ASSERT_TRUE(hit.has_value());
  auto got = b->Read(*hit);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Bytes(5000, 2));
  EXPECT_GE(b->Stats().events, 1u);
  // The subscriber waits for events without a deadline: no reconnect (and rebuild) while idle.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_LE(b->Stats().resyncs, 2u);
}

TEST_F(SharedTierTest, ServingRulesAreTheRadixIndexs) {
  auto t = Open();
  ASSERT_TRUE(t->Put(Record(Range(0, 100)), Bytes(1000, 1)));
  auto swa = Record(Range(500, 600));
  swa.exact_only = true;
  ASSERT_TRUE(t->Put(swa, Bytes(1000, 2)));
  ASSERT_TRUE(t->Put(Record(Range(600, 700), PayloadKind::kKvRecurrent), Bytes(1000, 3)));
  t->Flush();
  std::vector<Token> branch = Range(0, 60);
  branch.push_back(999);
  auto hit = t->Lookup("", branch);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->usable_tokens, 60u);
  EXPECT_FALSE(t->Lookup("", Range(500, 560)).has_value());
  EXPECT_EQ(Usable(*t, Range(500, 650)), 100u);
  EXPECT_FALSE(t->Lookup("", Range(600, 650)).has_value());
  EXPECT_EQ(Usable(*t, Range(600, 800)), 100u);
}

TEST_F(SharedTierTest, TenantsAndIdentitiesStayApart) {
  auto a = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 100), PayloadKind::kResidentKv, "tenant-a"), Bytes(6000, 3)));
  ASSERT_TRUE(a->Put(Record(Range(0, 100), PayloadKind::kResidentKv, "tenant-b"), Bytes(6000, 3)));
  a->Flush();
  // The same bytes under two tenants are two sets of blocks: no entry names another's blocks.
  EXPECT_EQ(BlockKeys().size(), 4u);
  auto b = Open();
  EXPECT_TRUE(b->Lookup("tenant-a", Range(0, 100)).has_value());
  EXPECT_FALSE(b->Lookup("tenant-c", Range(0, 100)).has_value());
  EXPECT_FALSE(b->Lookup("", Range(0, 100)).has_value());
  CacheConfigIdentity other = MakeScope().config;
  other.type_k = "q8_0";
  auto c = Open(other);
  EXPECT_EQ(c->Stats().loaded_at_open, 0u);
  EXPECT_FALSE(c->Lookup("tenant-a", Range(0, 100)).has_value());
}

TEST_F(SharedTierTest, ReplicasStoringTheSamePrefixSendItsBlocksOnce) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 100)), Bytes(9000, 4)));
  a->Flush();
  ASSERT_TRUE(b->WaitForEntries(1, 5000));
  EXPECT_FALSE(b->Put(Record(Range(0, 100)), Bytes(9000, 4)));  // known: skipped
  // A different prefix whose payload shares blocks sends only the new ones.
  auto bytes = Bytes(9000, 4);
  bytes.back() ^= 1;
  ASSERT_TRUE(b->Put(Record(Range(0, 101)), bytes));
  b->Flush();
  EXPECT_EQ(b->Stats().blocks_deduplicated, 2u);
  EXPECT_EQ(b->Stats().blocks_written, 1u);
  EXPECT_EQ(BlockKeys().size(), 4u);
}

TEST_F(SharedTierTest, ACorruptOrMissingBlockIsAMissThatRemovesTheEntry) {
  auto a = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 100)), Bytes(5000, 5)));
  ASSERT_TRUE(a->Put(Record(Range(200, 300)), Bytes(5000, 6)));
  a->Flush();
  auto b = Open();
  // Damage one block of the first entry: same length, one byte changed.
  auto hit = b->Lookup("", Range(0, 100));
  ASSERT_TRUE(hit.has_value());
  std::vector<std::string> blocks = BlockKeys();
  ASSERT_EQ(blocks.size(), 4u);
  const auto first = Bytes(5000, 5);
  std::string damaged;
  for (const std::string& k : blocks) {
    auto v = redis_->Command({"GET", k});
    if (v && v->size() == 4096 && std::equal(v->begin(), v->end(), reinterpret_cast<const char*>(first.data()))) {
      (*v)[100] ^= 1;
      ASSERT_EQ(redis_->Command({"SET", k, *v}), "OK");
      damaged = k;
    }
  }
  ASSERT_FALSE(damaged.empty());
  auto got = b->Read(*hit);
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_EQ(b->Stats().corrupt, 1u);
  EXPECT_FALSE(b->Lookup("", Range(0, 100)).has_value());
  EXPECT_EQ(redis_->Keys("skippy:*:m:*").size(), 1u);
  EXPECT_EQ(redis_->Command({"SCARD", redis_->Keys("skippy:*:set").at(0)}), "1");
  // The writer's mirror drops it too (the event).
  for (int i = 0; i < 100 && a->Lookup("", Range(0, 100)).has_value(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(a->Lookup("", Range(0, 100)).has_value());
  // A block evicted by Redis: a miss counted as gone.
  auto hit2 = b->Lookup("", Range(200, 300));
  ASSERT_TRUE(hit2.has_value());
  for (const std::string& k : BlockKeys()) ASSERT_TRUE(redis_->Command({"DEL", k}).has_value());
  auto got2 = b->Read(*hit2);
  EXPECT_TRUE(absl::IsNotFound(got2.status())) << got2.status();
  EXPECT_EQ(b->Stats().misses_gone, 1u);
  EXPECT_EQ(b->Stats().hits, 0u);
}

TEST_F(SharedTierTest, ABlockOfAnotherLengthIsCorruptBeforeAnythingIsCopied) {
  auto a = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 100)), Bytes(5000, 8)));
  a->Flush();
  auto b = Open();
  auto hit = b->Lookup("", Range(0, 100));
  ASSERT_TRUE(hit.has_value());
  const std::vector<std::string> blocks = BlockKeys();
  ASSERT_EQ(blocks.size(), 2u);
  auto v = redis_->Command({"GET", blocks[0]});
  ASSERT_TRUE(v.has_value());
  ASSERT_EQ(redis_->Command({"SET", blocks[0], v->substr(0, v->size() / 2)}), "OK");
  auto got = b->Read(*hit);
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_EQ(b->Stats().corrupt, 1u);
  EXPECT_FALSE(b->Lookup("", Range(0, 100)).has_value());
}

TEST_F(SharedTierTest, ADamagedOrForeignManifestIsNeverServed) {
  auto a = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 100)), Bytes(5000, 7)));
  a->Flush();
  const std::vector<std::string> manifests = redis_->Keys("skippy:*:m:*");
  ASSERT_EQ(manifests.size(), 1u);
  auto m = redis_->Command({"GET", manifests[0]});
  ASSERT_TRUE(m.has_value());
  (*m)[40] ^= 1;
  ASSERT_EQ(redis_->Command({"SET", manifests[0], *m}), "OK");
  auto b = Open();
  EXPECT_EQ(b->Stats().corrupt, 1u);
  EXPECT_FALSE(b->Lookup("", Range(0, 100)).has_value());
  // The first replica's mirror still names the old manifest: its read sees it changed.
  auto hit = a->Lookup("", Range(0, 100));
  ASSERT_TRUE(hit.has_value());
  EXPECT_TRUE(absl::IsNotFound(a->Read(*hit).status()));
}

TEST_F(SharedTierTest, ClearRemovesANamespaceFromRedisAndFromOtherReplicas) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a->Put(Record(Range(0, 100), PayloadKind::kResidentKv, "x"), Bytes(5000, 8)));
  ASSERT_TRUE(a->Put(Record(Range(0, 100), PayloadKind::kResidentKv, "y"), Bytes(5000, 9)));
  a->Flush();
  ASSERT_TRUE(b->WaitForEntries(2, 5000));
  EXPECT_EQ(b->Clear(std::string("x")), 1u);
  EXPECT_EQ(redis_->Keys("skippy:*:m:*").size(), 1u);
  EXPECT_EQ(BlockKeys().size(), 2u);
  for (int i = 0; i < 100 && a->Lookup("x", Range(0, 100)).has_value(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(a->Lookup("x", Range(0, 100)).has_value());
  EXPECT_TRUE(a->Lookup("y", Range(0, 100)).has_value());
}

// The first proposal for a name is what every replica gets back, whoever proposes later, and names
// stay apart; a Redis that is down is Unavailable at once, a refused password PermissionDenied.
TEST_F(SharedTierTest, ReplicasAgreeOnTheFirstValueProposed) {
  SharedAgreement a(Options()), b(Options());
  auto none = a.Get("class");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  auto first = a.Propose("class", R"({"on":true})");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, R"({"on":true})");
  auto second = b.Propose("class", R"({"on":false})");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, R"({"on":true})") << "a later proposal gets the first value back";
  auto got = b.Get("class");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, R"({"on":true})");
  auto other = b.Propose("another name", "x");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, "x");
  EXPECT_EQ(redis_->Keys("skippy:agree:*").size(), 2u);

  SharedTierOptions wrong = Options();
  wrong.password = "wrong";
  EXPECT_TRUE(absl::IsPermissionDenied(SharedAgreement(wrong).Get("class").status()));
  redis_->Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto t0 = Clock::now();
  EXPECT_TRUE(absl::IsUnavailable(SharedAgreement(Options(200)).Propose("class", "y").status()));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
}

TEST_F(SharedTierTest, ARefusedPasswordIsAnErrorAtOpen) {
  SharedTierOptions o = Options();
  o.password = "wrong";
  auto t = SharedTier::Open(o, MakeScope().config);
  EXPECT_TRUE(absl::IsPermissionDenied(t.status())) << t.status();
  o.password = "";
  auto none = SharedTier::Open(o, MakeScope().config);
  EXPECT_TRUE(absl::IsPermissionDenied(none.status())) << none.status();
}

TEST_F(SharedTierTest, RedisDownPausedOrRestartedMakesReadsMissQuicklyNeverFail) {
  auto a = Open(MakeScope().config, /*timeout_ms=*/200);
  ASSERT_TRUE(a->Put(Record(Range(0, 100)), Bytes(5000, 10)));
  a->Flush();
  auto hit = a->Lookup("", Range(0, 100));
  ASSERT_TRUE(hit.has_value());

  // Paused: accepts, never answers. The read's deadline ends it.
  redis_->Pause();
  auto t0 = Clock::now();
  auto paused = a->Read(*hit);
  EXPECT_TRUE(absl::IsUnavailable(paused.status())) << paused.status();
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1500));
  // Within retry_ms no new attempt is made: the next read fails at once.
  t0 = Clock::now();
  EXPECT_TRUE(absl::IsUnavailable(a->Read(*hit).status()));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(50));
  // A replica that opens while Redis is paused starts anyway, within its deadlines.
  t0 = Clock::now();
  auto during_pause = Open(MakeScope().config, /*timeout_ms=*/200);
  ASSERT_NE(during_pause, nullptr);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(2000));
  EXPECT_FALSE(during_pause->Stats().connected);
  redis_->Resume();

  // Down: refused connections.
  redis_->Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  t0 = Clock::now();
  EXPECT_TRUE(absl::IsUnavailable(a->Read(*hit).status()));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_TRUE(a->Put(Record(Range(300, 400)), Bytes(5000, 11)));
  a->Flush();
  EXPECT_GE(a->Stats().write_drops, 1u);
  EXPECT_FALSE(a->Stats().connected);
  EXPECT_GE(a->Stats().unavailable, 2u);
  // A replica can start while Redis is down.
  auto b = Open(MakeScope().config, /*timeout_ms=*/200);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->Stats().entries, 0u);

  // Back, empty: the mirrors resync (the entry is gone), and new writes reach the other replica.
  ASSERT_TRUE(redis_->Restart());
  for (int i = 0; i < 200 && a->Lookup("", Range(0, 100)).has_value(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(a->Lookup("", Range(0, 100)).has_value());
  bool stored = false;
  for (int i = 0; i < 50 && !stored; ++i) {  // the writer's connection comes back after retry_ms
    ASSERT_TRUE(a->Put(Record(Range(500, 600)), Bytes(5000, 12)));
    a->Flush();
    stored = a->Stats().writes == 2;
    if (!stored) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(stored);
  ASSERT_TRUE(b->WaitForEntries(1, 5000));
  auto hit2 = b->Lookup("", Range(500, 600));
  ASSERT_TRUE(hit2.has_value());
  auto got = b->Read(*hit2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Bytes(5000, 12));
}

}  // namespace
}  // namespace skippy::cache
