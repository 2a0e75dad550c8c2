// Randomized differential tests: long random operation sequences against brute-force reference
// models, checking identical answers after every operation and that no cap is ever exceeded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "skippy/cache/payload_store.h"
#include "skippy/cache/resident_pool.h"
#include "test_util.h"

namespace skippy::cache {
namespace {

using testing::MakeScope;

// ---- Reference model of ResidentPool (and the RadixIndex inside it) ---------------------------

struct RefEntry {
  EntryId id;
  int scope;
  std::vector<Token> tokens;
  RecordRequest req;
  int32_t seq;
  uint32_t refs = 0;
  uint64_t last_use = 0;
  bool live = true;
};

struct RefPending {
  int scope;
  std::vector<Token> tokens;
  RecordRequest req;
  int32_t seq;
};

struct RefGhost {
  int scope;
  std::vector<Token> tokens;
  PayloadKind kind;
};

size_t Lcp(const std::vector<Token>& a, std::span<const Token> b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Length a (kind, tokens) entry serves for q.
size_t Serves(PayloadKind kind, const std::vector<Token>& tokens, std::span<const Token> q) {
  size_t l = Lcp(tokens, q);
  if (ServesShorterPrefixes(kind)) return l;
  return l == tokens.size() ? l : 0;
}

class RefPool {
 public:
  RefPool(const ResidentPoolOptions& o, std::vector<PrefixScope> scopes) : o_(o), scopes_(std::move(scopes)) {
    for (int32_t s = o.seq_id_begin; s < o.seq_id_end; ++s) free_.insert(s);
  }

  LookupResult Answer(int scope, std::span<const Token> q) const {
    LookupResult r;
    const RefEntry* best = nullptr;
    size_t best_len = 0;
    for (const auto& [id, e] : entries_) {
      if (!e.live || e.scope != scope) continue;
      size_t l = Serves(e.req.kind, e.tokens, q);
      if (l == 0) continue;
      if (best == nullptr || l > best_len || (l == best_len && Better(e, *best, l))) {
        best = &e;
        best_len = l;
      }
    }
    if (best) {
      r.match = Match{Info(*best), best_len, best_len == best->tokens.size()};
      return r;
    }
    for (const RefGhost& g : ghosts_) {
      if (g.scope == scope && Serves(g.kind, g.tokens, q) > 0) {
        r.miss_reason = MissReason::kEvicted;
        return r;
      }
    }
    for (const auto& [id, e] : entries_) {
      if (e.live && e.scope != scope && scopes_[e.scope].cache_namespace == scopes_[scope].cache_namespace &&
          Serves(e.req.kind, e.tokens, q) > 0) {
        r.miss_reason = MissReason::kIdentityMismatch;
        return r;
      }
    }
    r.miss_reason = MissReason::kNeverSeen;
    return r;
  }

  LookupResult Lookup(int scope, std::span<const Token> q, bool pin) {
    LookupResult r = Answer(scope, q);
    if (r.hit()) {
      RefEntry& e = entries_.at(r.match->entry.id);
      e.last_use = ++clock_;
      if (pin) ++e.refs;
    }
    return r;
  }

  StatusOr<Reservation> Reserve(int scope, const std::vector<Token>& t, const RecordRequest& req) {
    if (t.empty() || req.bytes > o_.max_bytes || (req.needs_sequence && t.size() > o_.max_tokens)) {
      return absl::InvalidArgumentError("");
    }
    for (const auto& [id, e] : entries_) {
      if (e.live && e.scope == scope && e.tokens == t && e.req.kind == req.kind) {
        return absl::FailedPreconditionError("");
      }
    }
    for (const auto& [id, p] : pending_) {
      if (p.scope == scope && p.tokens == t && p.req.kind == req.kind) return absl::FailedPreconditionError("");
    }
    // The token cap counts only entries that hold a cache sequence.
    size_t n = 1, tok = req.needs_sequence ? t.size() : 0, seqs = free_.size();
    uint64_t bytes = req.bytes;
    for (const auto& [id, e] : entries_) {
      n += 1, bytes += e.req.bytes;
      if (e.seq != kNoSequence) tok += e.tokens.size();
    }
    for (const auto& [id, p] : pending_) {
      n += 1, bytes += p.req.bytes;
      if (p.seq != kNoSequence) tok += p.tokens.size();
    }
    auto shared_fit = [&] { return n <= o_.max_entries && bytes <= o_.max_bytes; };
    auto fits = [&] { return shared_fit() && tok <= o_.max_tokens && (!req.needs_sequence || seqs > 0); };
    std::vector<const RefEntry*> order;
    for (const auto& [id, e] : entries_) {
      if (e.live && e.refs == 0) order.push_back(&e);
    }
    std::sort(order.begin(), order.end(), [&](const RefEntry* a, const RefEntry* b) { return Key(*a) < Key(*b); });
    std::vector<EntryId> victims;
    for (const RefEntry* e : order) {
      if (fits()) break;
      if (e->seq == kNoSequence && shared_fit()) continue;  // evicting it would not help
      victims.push_back(e->id);
      n -= 1, bytes -= e->req.bytes;
      if (e->seq != kNoSequence) tok -= e->tokens.size(), ++seqs;
    }
    if (!fits()) return absl::ResourceExhaustedError("");
    Reservation r;
    for (EntryId v : victims) {
      RefEntry& e = entries_.at(v);
      r.evictions.push_back(Info(e));
      RemoveLive(e);
      Free(v);
      ++evictions_;
    }
    int32_t seq = kNoSequence;
    if (req.needs_sequence) {
      seq = *free_.begin();
      free_.erase(free_.begin());
    }
    r.id = next_rid_++;
    r.seq_id = seq;
    pending_[r.id] = {scope, t, req, seq};
    return r;
  }

  StatusOr<EntryId> Commit(ReservationId rid) {
    auto it = pending_.find(rid);
    if (it == pending_.end()) return absl::NotFoundError("");
    RefEntry e{next_id_++, it->second.scope, it->second.tokens, it->second.req, it->second.seq};
    e.last_use = ++clock_;
    entries_[e.id] = e;
    pending_.erase(it);
    return e.id;
  }

  Status Abort(ReservationId rid) {
    auto it = pending_.find(rid);
    if (it == pending_.end()) return absl::NotFoundError("");
    if (it->second.seq != kNoSequence) free_.insert(it->second.seq);
    pending_.erase(it);
    return absl::OkStatus();
  }

  StatusOr<std::optional<EntryInfo>> Release(EntryId id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) return absl::NotFoundError("");
    if (it->second.refs == 0) return absl::FailedPreconditionError("");
    if (--it->second.refs > 0 || it->second.live) return std::optional<EntryInfo>();
    EntryInfo info = Info(it->second);
    Free(id);
    return std::optional<EntryInfo>(info);
  }

  StatusOr<std::optional<EntryInfo>> Erase(EntryId id) {
    auto it = entries_.find(id);
    if (it == entries_.end() || !it->second.live) return absl::NotFoundError("");
    RemoveLive(it->second);
    if (it->second.refs > 0) return std::optional<EntryInfo>();
    EntryInfo info = Info(it->second);
    Free(id);
    return std::optional<EntryInfo>(info);
  }

  const std::map<EntryId, RefEntry>& entries() const { return entries_; }
  const std::map<ReservationId, RefPending>& pending() const { return pending_; }
  uint64_t evictions() const { return evictions_; }

 private:
  std::tuple<double, uint64_t, EntryId> Key(const RefEntry& e) const {
    double prio = 0;
    if (o_.index.policy == EvictionPolicy::kCostAware) {
      prio = e.req.recompute_cost / static_cast<double>(std::max<uint64_t>(e.req.bytes, 1));
    }
    return {prio, e.last_use, e.id};
  }
  // Tie-break among entries serving the same length (see radix_index.h).
  static bool Better(const RefEntry& a, const RefEntry& b, size_t len) {
    bool ea = a.tokens.size() == len, eb = b.tokens.size() == len;
    if (ea != eb) return ea;
    if (ea) return a.req.kind < b.req.kind;
    return a.tokens < b.tokens;
  }
  static EntryInfo Info(const RefEntry& e) {
    EntryInfo i;
    i.id = e.id;
    i.tokens = e.tokens.size();
    i.desc = {e.req.kind, e.req.bytes, e.seq, 0, e.req.recompute_cost};
    return i;
  }
  void RemoveLive(RefEntry& e) {
    e.live = false;
    ghosts_.push_back({e.scope, e.tokens, e.req.kind});
  }
  void Free(EntryId id) {
    auto it = entries_.find(id);
    if (it->second.seq != kNoSequence) free_.insert(it->second.seq);
    entries_.erase(it);
  }

  ResidentPoolOptions o_;
  std::vector<PrefixScope> scopes_;
  std::map<EntryId, RefEntry> entries_;
  std::map<ReservationId, RefPending> pending_;
  std::vector<RefGhost> ghosts_;
  std::set<int32_t> free_;
  EntryId next_id_ = 1;
  ReservationId next_rid_ = 1;
  uint64_t clock_ = 0;
  uint64_t evictions_ = 0;
};

void ExpectSame(const LookupResult& got, const LookupResult& want, const char* what, int op) {
  ASSERT_EQ(got.hit(), want.hit()) << what << " op " << op;
  if (!want.hit()) {
    ASSERT_EQ(got.miss_reason, want.miss_reason) << what << " op " << op;
    return;
  }
  ASSERT_EQ(got.match->entry.id, want.match->entry.id) << what << " op " << op;
  ASSERT_EQ(got.match->usable_tokens, want.match->usable_tokens) << what << " op " << op;
  ASSERT_EQ(got.match->exact_boundary, want.match->exact_boundary) << what << " op " << op;
}

void RunPoolSeed(uint32_t seed, int ops, uint64_t* identity_mismatches) {
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int vocab = uni(2, 6);
  std::vector<PrefixScope> scopes = {MakeScope("a", vocab), MakeScope("b", vocab), MakeScope("a", vocab, "model-b")};
  ResidentPoolOptions o;
  o.max_entries = uni(2, 12);
  o.max_tokens = uni(12, 60);
  o.max_bytes = uni(30, 300);
  o.lane_count = uni(0, 3);
  o.seq_id_begin = o.lane_count;
  o.seq_id_end = o.seq_id_begin + uni(1, 10);
  o.index.policy = seed % 2 ? EvictionPolicy::kCostAware : EvictionPolicy::kLru;
  o.index.max_ghost_entries = 1u << 30;  // the reference remembers every removed entry
  o.index.max_ghost_tokens = 1u << 30;
  auto pool = std::move(*ResidentPool::Create(o));
  RefPool ref(o, scopes);
  std::vector<std::vector<Token>> seen;

  auto random_tokens = [&] {
    std::vector<Token> t;
    int source = uni(0, 99);
    if (source < 45 && !ref.entries().empty()) {
      auto it = ref.entries().begin();
      std::advance(it, uni(0, static_cast<int>(ref.entries().size()) - 1));
      seen.push_back(it->second.tokens);
    }
    if (!seen.empty() && source < 70) {
      t = source < 45 ? seen.back() : seen[uni(0, static_cast<int>(seen.size()) - 1)];
      if (source < 45) seen.pop_back();
      int mode = uni(0, 2);
      if (mode == 0 && t.size() > 1) t.resize(uni(1, static_cast<int>(t.size())));
      if (mode == 1) {
        int extra = uni(1, 4);
        for (int i = 0; i < extra; ++i) t.push_back(uni(0, vocab - 1));
      }
      return t;
    }
    int len = uni(1, 10);
    for (int i = 0; i < len; ++i) t.push_back(uni(0, vocab - 1));
    return t;
  };

  for (int op = 0; op < ops; ++op) {
    int scope = uni(0, 9) < 9 ? 0 : uni(1, 2);
    int choice = uni(0, 99);
    if (choice < 30) {  // reserve (+ maybe commit/abort right away)
      std::vector<Token> t = random_tokens();
      if (uni(0, 50) == 0) t.clear();  // bad input
      RecordRequest req;
      int k = uni(0, 9);
      req.kind = k < 6 ? PayloadKind::kResidentKv : (k < 9 ? PayloadKind::kKvRecurrent : PayloadKind::kFullState);
      req.bytes = uni(0, 60);
      req.recompute_cost = uni(0, 8);
      req.needs_sequence = uni(0, 4) > 0;
      auto got = pool->Reserve(scopes[scope], t, req);
      auto want = ref.Reserve(scope, t, req);
      ASSERT_EQ(got.status().code(), want.status().code()) << "reserve op " << op << " " << got.status();
      if (got.ok()) {
        ASSERT_EQ(got->id, want->id);
        ASSERT_EQ(got->seq_id, want->seq_id) << "op " << op;
        ASSERT_EQ(got->evictions.size(), want->evictions.size()) << "op " << op;
        for (size_t i = 0; i < got->evictions.size(); ++i) {
          ASSERT_EQ(got->evictions[i].id, want->evictions[i].id) << "op " << op;
          ASSERT_EQ(got->evictions[i].desc.seq_id, want->evictions[i].desc.seq_id);
        }
        seen.push_back(t);
        if (uni(0, 3) > 0) {
          auto a = pool->Commit(got->id);
          auto b = ref.Commit(want->id);
          ASSERT_TRUE(a.ok() && b.ok()) << a.status();
          ASSERT_EQ(*a, *b);
        }
      }
    } else if (choice < 38) {  // settle an open reservation
      if (ref.pending().empty()) continue;
      auto it = ref.pending().begin();
      std::advance(it, uni(0, static_cast<int>(ref.pending().size()) - 1));
      ReservationId rid = it->first;
      if (uni(0, 2) > 0) {
        auto a = pool->Commit(rid);
        auto b = ref.Commit(rid);
        ASSERT_EQ(a.status().code(), b.status().code());
        if (a.ok()) {
          ASSERT_EQ(*a, *b);
        }
      } else {
        ASSERT_EQ(pool->Abort(rid).code(), ref.Abort(rid).code());
      }
    } else if (choice < 70) {  // lookup (maybe pin)
      std::vector<Token> q = random_tokens();
      bool pin = uni(0, 2) == 0;
      ExpectSame(pool->Lookup(scopes[scope], q, pin), ref.Lookup(scope, q, pin), "lookup", op);
    } else if (choice < 78) {  // peek
      std::vector<Token> q = random_tokens();
      ExpectSame(pool->Peek(scopes[scope], q), ref.Answer(scope, q), "peek", op);
    } else if (choice < 92) {  // release a pin (sometimes a double release)
      if (ref.entries().empty()) continue;
      std::vector<EntryId> pinned;
      for (const auto& [eid, e] : ref.entries()) {
        if (e.refs > 0) pinned.push_back(eid);
      }
      EntryId id;
      if (!pinned.empty() && uni(0, 4) > 0) {
        id = pinned[uni(0, static_cast<int>(pinned.size()) - 1)];
      } else {  // mostly unpinned: a double release, which must be refused
        auto it = ref.entries().begin();
        std::advance(it, uni(0, static_cast<int>(ref.entries().size()) - 1));
        id = it->first;
      }
      auto a = pool->Release(id);
      auto b = ref.Release(id);
      ASSERT_EQ(a.status().code(), b.status().code()) << "release op " << op;
      if (a.ok()) {
        ASSERT_EQ(a->has_value(), b->has_value());
        if (a->has_value()) {
          ASSERT_EQ((*a)->id, (*b)->id);
        }
      }
    } else {  // erase
      EntryId id = 0;
      if (!ref.entries().empty()) {
        auto it = ref.entries().begin();
        std::advance(it, uni(0, static_cast<int>(ref.entries().size()) - 1));
        id = it->first;
      }
      auto a = pool->Erase(id);
      auto b = ref.Erase(id);
      ASSERT_EQ(a.status().code(), b.status().code()) << "erase op " << op;
      if (a.ok()) {
        ASSERT_EQ(a->has_value(), b->has_value());
      }
    }

    // Accounting and caps after every operation.
    PoolStats st = pool->Stats();
    size_t live = 0, zombies = 0, tokens = 0;
    uint64_t bytes = 0;
    size_t resident_tokens = 0;
    for (const auto& [id, e] : ref.entries()) {
      (e.live ? live : zombies) += 1;
      tokens += e.tokens.size();
      bytes += e.req.bytes;
      if (e.seq != kNoSequence) resident_tokens += e.tokens.size();
    }
    for (const auto& [id, p] : ref.pending()) {
      tokens += p.tokens.size(), bytes += p.req.bytes;
      if (p.seq != kNoSequence) resident_tokens += p.tokens.size();
    }
    ASSERT_EQ(st.index.entries, live) << "op " << op;
    ASSERT_EQ(st.index.zombie_entries, zombies) << "op " << op;
    ASSERT_EQ(st.used_entries, live + zombies + ref.pending().size());
    ASSERT_EQ(st.used_tokens, tokens);
    ASSERT_EQ(st.used_bytes, bytes);
    ASSERT_EQ(st.index.evictions, ref.evictions());
    ASSERT_LE(st.used_entries, o.max_entries);
    ASSERT_EQ(st.resident_tokens, resident_tokens);
    ASSERT_LE(st.resident_tokens, o.max_tokens);
    ASSERT_LE(st.used_bytes, o.max_bytes);
    if (op % 16 == 0) {
      ASSERT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants() << " op " << op;
    }
  }
  ASSERT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
  // The run must have exercised the interesting paths, not just misses.
  PoolStats st = pool->Stats();
  EXPECT_GT(st.index.hits, static_cast<uint64_t>(ops / 20));
  EXPECT_GT(st.index.miss_never_seen, 0u);
  EXPECT_GT(st.index.evictions, 0u);
  EXPECT_GT(st.index.miss_evicted, 0u);
  // Identity mismatches (another configuration in the same namespace) are rarer: counted over
  // all seeds by the caller.
  *identity_mismatches += st.index.miss_identity_mismatch;
  EXPECT_GT(st.reserve_failures, 0u);
  std::printf("seed %u: hits %llu misses %llu (never %llu, evicted %llu, mismatch %llu) evictions %llu "
              "reserve failures %llu\n",
              seed, (unsigned long long)st.index.hits, (unsigned long long)st.index.misses,
              (unsigned long long)st.index.miss_never_seen, (unsigned long long)st.index.miss_evicted,
              (unsigned long long)st.index.miss_identity_mismatch, (unsigned long long)st.index.evictions,
              (unsigned long long)st.reserve_failures);
}

TEST(Randomized, ResidentPoolMatchesBruteForceReference) {
  // 8 seeds x 15,000 operations = 120,000 operations.
  uint64_t identity_mismatches = 0;
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RunPoolSeed(seed, 15000, &identity_mismatches);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(identity_mismatches, 0u);
}

// ---- PayloadStore against a reference of live payload contents ---------------------------------

void RunStoreSeed(uint32_t seed, int ops) {
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const size_t block = 16;
  const uint64_t cap = uni(64, 256);
  auto store = std::move(*PayloadStore::Create({block, cap, 2}));
  // Building blocks: a few fixed patterns so payloads share blocks often.
  std::vector<std::vector<std::byte>> patterns(12);
  for (auto& p : patterns) {
    p.resize(block);
    for (auto& b : p) b = static_cast<std::byte>(uni(0, 3));
  }
  std::map<PayloadId, std::vector<std::byte>> live;  // payload contents by id
  std::map<PayloadId, int> pins;
  std::set<PayloadId> released_pinned;
  std::vector<PayloadId> evicted;  // told through each payload's on_evict, during the Put that evicts it
  for (int op = 0; op < ops; ++op) {
    int choice = uni(0, 99);
    if (choice < 40) {
      std::vector<std::byte> data;
      int nblocks = uni(1, 6);
      for (int i = 0; i < nblocks; ++i) {
        const auto& p = patterns[uni(0, 11)];
        data.insert(data.end(), p.begin(), p.end());
      }
      data.resize(data.size() - uni(0, static_cast<int>(block) - 1));
      evicted.clear();
      auto put = store->Put(data, [&evicted](PayloadId e) { evicted.push_back(e); });
      for (PayloadId e : evicted) {
        ASSERT_TRUE(live.count(e)) << "evicted an unknown payload";
        ASSERT_EQ(pins[e], 0) << "evicted a pinned payload";
        ASSERT_FALSE(store->Contains(e));
        live.erase(e);
      }
      if (put.ok()) {
        live[put->id] = data;
      } else {
        ASSERT_TRUE(put.status().code() == absl::StatusCode::kResourceExhausted ||
                    put.status().code() == absl::StatusCode::kInvalidArgument)
            << put.status();
      }
    } else if (choice < 60 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, uni(0, static_cast<int>(live.size()) - 1));
      auto got = store->Get(it->first);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(*got, it->second) << "op " << op;
    } else if (choice < 72 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, uni(0, static_cast<int>(live.size()) - 1));
      if (released_pinned.count(it->first)) continue;
      ASSERT_TRUE(store->Pin(it->first).ok());
      ++pins[it->first];
    } else if (choice < 84) {
      std::vector<PayloadId> pinned_ids;
      for (auto& [id, n] : pins) {
        if (n > 0) pinned_ids.push_back(id);
      }
      if (pinned_ids.empty()) continue;
      PayloadId id = pinned_ids[uni(0, static_cast<int>(pinned_ids.size()) - 1)];
      ASSERT_TRUE(store->Unpin(id).ok());
      if (--pins[id] == 0 && released_pinned.erase(id)) live.erase(id);
    } else if (!live.empty()) {
      // Batch release; sometimes poisoned with a bad id, which must change nothing.
      std::vector<PayloadId> batch;
      for (const auto& [id, d] : live) {
        if (!released_pinned.count(id) && uni(0, 3) == 0) batch.push_back(id);
      }
      bool poison = uni(0, 4) == 0;
      if (poison) batch.push_back(uni(0, 1) ? 999999 : (batch.empty() ? 999998 : batch.front()));
      PayloadStats before = store->Stats();
      Status st = store->Release(batch);
      if (poison) {
        ASSERT_FALSE(st.ok());
        PayloadStats after = store->Stats();
        ASSERT_EQ(before.payloads, after.payloads);
        ASSERT_EQ(before.physical_bytes, after.physical_bytes);
        ASSERT_EQ(before.logical_bytes, after.logical_bytes);
      } else {
        ASSERT_TRUE(st.ok()) << st;
        for (PayloadId id : batch) {
          if (pins[id] > 0) {
            released_pinned.insert(id);
          } else {
            live.erase(id);
          }
        }
      }
    }
    PayloadStats st = store->Stats();
    ASSERT_LE(st.physical_bytes, cap) << "op " << op;
    ASSERT_EQ(st.payloads, live.size()) << "op " << op;
    uint64_t logical = 0;
    for (const auto& [id, d] : live) logical += d.size();
    ASSERT_EQ(st.logical_bytes, logical);
    if (op % 32 == 0) {
      ASSERT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();
    }
  }
  ASSERT_TRUE(store->CheckInvariants().ok()) << store->CheckInvariants();
  PayloadStats st = store->Stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_GT(st.shared_block_hits, 0u);
  std::printf("seed %u: puts %llu evictions %llu shared blocks %llu\n", seed, (unsigned long long)st.puts,
              (unsigned long long)st.evictions, (unsigned long long)st.shared_block_hits);
}

TEST(Randomized, PayloadStoreKeepsContentsAndCaps) {
  // 6 seeds x 10,000 operations.
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RunStoreSeed(seed, 10000);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace skippy::cache
