// The lane cache against a fake backend: every strategy's restore and record plan, lane reuse,
// namespaces, eviction (also while an entry is pinned) and the disabled cache. No llama.cpp, no
// model files. A restored lane is compared with what a recompute of the same prefix holds.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <optional>

#include "../support/redis_server.h"
#include "fake_backend.h"
#include "skippy/cache/payload_store.h"
#include "skippy/lane_cache/lane_cache.h"
#include "skippy/lane_cache/recorder.h"

namespace skippy::lane_cache {
namespace {

using testing::FakeBackend;
using Kind = FakeBackend::Kind;

std::vector<Token> Seq(Token first, size_t n) {
  std::vector<Token> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<Token> Cat(std::vector<Token> a, const std::vector<Token>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<float> LogitsOf(std::span<const Token> prompt) {
  std::vector<float> logits(FakeBackend::kVocab, 0.0f);
  logits[FakeBackend::Chain(prompt) % FakeBackend::kVocab] = static_cast<float>(prompt.size());
  return logits;
}

struct Ran {
  JobStart start;
  std::vector<size_t> boundaries_seen;  // AtBoundary calls
};

// What a scheduler does with one job: Begin, prefill in the planned batches (AtBoundary after each
// but the last), the first token, then `answer` decoded one row at a time and Finish with it; with
// no answer, one decoded token that Finish is not told of.
Ran RunTurn(LaneCache& cache, FakeBackend& backend, int32_t lane, const std::vector<Token>& prompt,
            const std::vector<Token>& answer, std::vector<size_t> message_ends = {}, const std::string& ns = "",
            NextTurnFn next_turn = {}) {
  Ran r;
  r.start = cache.Begin(lane, ns, prompt, message_ends);
  EXPECT_EQ(backend.kv(lane), std::vector<Token>(prompt.begin(), prompt.begin() + r.start.restored))
      << "the restored lane is not the prompt's prefix";
  if (backend.recurrent_kind()) {
    EXPECT_EQ(backend.recurrent(lane), FakeBackend::Chain(std::span(prompt).first(r.start.restored)))
        << "the restored recurrent state is not a recompute's";
  }
  if (!r.start.decoded) {
    size_t pos = r.start.restored;
    EXPECT_FALSE(r.start.chunk_ends.empty());
    EXPECT_EQ(r.start.chunk_ends.back(), prompt.size());
    for (size_t end : r.start.chunk_ends) {
      EXPECT_GT(end, pos);
      backend.Append(lane, std::span(prompt).subspan(pos, end - pos));
      pos = end;
      if (end < prompt.size()) {
        cache.AtBoundary(lane, end);
        r.boundaries_seen.push_back(end);
      }
    }
  } else {
    EXPECT_EQ(r.start.restored, prompt.size());
    EXPECT_EQ(r.start.decoded->logits, LogitsOf(prompt));
  }
  cache.AfterFirstToken(lane, LogitsOf(prompt));
  if (answer.empty()) {
    const Token generated = 999;
    backend.Append(lane, std::span(&generated, 1));
    cache.Finish(lane, true);
    return r;
  }
  for (Token t : answer) backend.AppendDecoded(lane, t);
  cache.Finish(lane, true, answer, std::move(next_turn));
  return r;
}

Ran RunJob(LaneCache& cache, FakeBackend& backend, int32_t lane, const std::vector<Token>& prompt,
           std::vector<size_t> message_ends = {}, const std::string& ns = "") {
  return RunTurn(cache, backend, lane, prompt, {}, std::move(message_ends), ns);
}

std::unique_ptr<LaneCache> Make(FakeBackend& backend, LaneCacheOptions o = {}) {
  o.record_stride = 16;
  auto c = LaneCache::Create(o, backend);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

void ExpectConsistent(const LaneCache& c) {
  const LaneCacheStats s = c.Stats();
  EXPECT_EQ(s.cache.pool.index.entries, s.tier.payloads) << "an entry without its payload, or the reverse";
}

TEST(Dense, LaneReuseThenStoredEntryOnAnotherLane) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b);
  EXPECT_EQ(c->strategy().name(), "dense");
  const auto doc = Seq(1, 100);
  const Ran first = RunJob(*c, b, 0, Cat(doc, Seq(500, 10)));
  EXPECT_EQ(first.start.miss_reason, "never-seen");
  EXPECT_EQ(c->Stats().records, 1u) << "dense records the prompt end only";
  // The same lane keeps its prompt and is cut back to the shared 100 tokens.
  const Ran second = RunJob(*c, b, 0, Cat(doc, Seq(600, 10)));
  EXPECT_EQ(second.start.miss_reason, "");
  EXPECT_EQ(second.start.restored, 100u);
  EXPECT_EQ(c->Stats().lane_hits, 1u);
  // Another lane imports the stored entry of the first prompt, cut to the shared prefix.
  const Ran third = RunJob(*c, b, 1, Cat(doc, Seq(700, 10)));
  EXPECT_EQ(third.start.payload, "resident-kv");
  EXPECT_EQ(third.start.restored, 100u);
  EXPECT_EQ(c->Stats().stored_hits, 1u);
  ExpectConsistent(*c);
}

TEST(Dense, ExactRepeatIsAnsweredFromItsDecodedResult) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b);
  const auto prompt = Seq(1, 80);
  RunJob(*c, b, 0, prompt);
  const Ran again = RunJob(*c, b, 1, prompt);
  ASSERT_NE(again.start.decoded, nullptr);
  EXPECT_EQ(again.start.restored, prompt.size());
  EXPECT_TRUE(again.start.chunk_ends.empty());
}

TEST(Dense, DecodedResultsOfTwoClassingsNeverShareAScope) {
  // A namespace ends with the client's cache salt. The decoded result of a prompt with a short
  // message is kept apart from the same tokens in long batches only; a salt that ends like that
  // mark must not land in the other's scope (its logits were computed in another batch class).
  cache::PrefixScope scope;
  scope.cache_namespace = "0.0/0:|S";
  const size_t message_end[] = {90};
  const cache::BatchClasses short_end = cache::BatchClasses::Of(100, message_end, 32);
  const cache::BatchClasses long_only = cache::BatchClasses::Of(100, {}, 32);
  ASSERT_FALSE(short_end.Fingerprint().empty());
  ASSERT_TRUE(long_only.Fingerprint().empty());
  cache::PrefixScope salted = scope;
  salted.cache_namespace += "#short:" + short_end.Fingerprint();
  EXPECT_NE(DecodedScope(scope, short_end), DecodedScope(salted, long_only));
  EXPECT_NE(DecodedScope(scope, short_end), DecodedScope(scope, long_only));
  EXPECT_EQ(DecodedScope(scope, short_end), DecodedScope(scope, short_end));
}

TEST(Dense, ARestoreLeavesABatchOfTheLastRunsClassToPrefill) {
  FakeBackend b(Kind::kDense, 2, /*min_batch=*/64);
  auto c = Make(b);
  const auto doc = Seq(1, 300);
  RunJob(*c, b, 0, doc);
  // A prompt that extends the document by 10 tokens: a 64-row batch must be left, so the restore
  // ends at 310 - 64 at most.
  const Ran r = RunJob(*c, b, 1, Cat(doc, Seq(800, 10)));
  EXPECT_GT(r.start.restored, 0u);
  EXPECT_LE(r.start.restored, 310u - 64u);
  for (size_t i = 0, pos = r.start.restored; i < r.start.chunk_ends.size(); pos = r.start.chunk_ends[i++]) {
    EXPECT_GE(r.start.chunk_ends[i] - pos, 64u) << "a batch below the long class";
  }
}

TEST(Dense, ShortMessagesAreNotServedFromRowsComputedInLongBatches) {
  FakeBackend b(Kind::kDense, 2, /*min_batch=*/64);
  auto c = Make(b);
  const auto prompt = Seq(1, 200);
  RunJob(*c, b, 0, prompt);  // raw: one long run
  // The same tokens as a chat whose last messages are short: rows past 180 are classed short now.
  const Ran chat = RunJob(*c, b, 1, Cat(prompt, Seq(900, 6)), {100, 180, 190, 200, 203});
  EXPECT_LE(chat.start.restored, 180u) << "restored rows computed in another batch class";
}

TEST(SlidingWindow, RecordsPlannedBoundariesThatServeTheirExactLength) {
  FakeBackend b(Kind::kSlidingWindow, 2, 2, /*n_swa=*/32);
  auto c = Make(b);
  EXPECT_EQ(c->strategy().name(), "sliding-window");
  const auto doc = Seq(1, 120);
  const Ran first = RunJob(*c, b, 0, Cat(doc, Seq(500, 20)), {120, 140});
  EXPECT_FALSE(first.boundaries_seen.empty()) << "no planned records";
  EXPECT_GT(c->Stats().records, 1u) << "boundaries and the prompt end are recorded";
  // Another lane: only an entry's exact length serves (longer than the window); the turn boundary
  // at 120 was recorded, so the next question restores exactly the document.
  const Ran other = RunJob(*c, b, 1, Cat(doc, Seq(600, 20)), {120, 140});
  EXPECT_EQ(other.start.restored, 120u);
  EXPECT_EQ(other.start.payload, "resident-kv");
  EXPECT_EQ(b.PaddedPrefix(1), 120) << "an exact-length entry is imported padded back to position 0";
  ExpectConsistent(*c);
}

TEST(SlidingWindow, LaneWinsOverAPaddedImportThatSavesLittle) {
  FakeBackend b(Kind::kSlidingWindow, 2, 2, 32);
  auto c = Make(b);
  const auto doc = Seq(1, 150);
  RunJob(*c, b, 0, Cat(doc, Seq(500, 20)), {150, 170});
  const Ran again = RunJob(*c, b, 0, Cat(doc, Seq(600, 20)), {150, 170});
  EXPECT_EQ(c->Stats().lane_hits, 1u);
  EXPECT_EQ(again.start.restored, 150u);
}

TEST(Hybrid, ALaneHitRestoresOnlyTheRecurrentState) {
  FakeBackend b(Kind::kHybrid);
  auto c = Make(b);
  EXPECT_EQ(c->strategy().name(), "hybrid");
  const auto doc = Seq(1, 128);
  const Ran first = RunJob(*c, b, 0, Cat(doc, Seq(500, 12)), {128, 140});
  EXPECT_FALSE(first.boundaries_seen.empty());
  // Records were deferred to the prompt end: one full export plus one recurrent copy per boundary.
  EXPECT_GE(c->Stats().records, 2u);
  const Ran second = RunJob(*c, b, 0, Cat(doc, Seq(600, 12)), {128, 140});
  EXPECT_EQ(second.start.restored, 128u);
  EXPECT_EQ(second.start.payload, "kv-recurrent");
  EXPECT_EQ(c->Stats().recurrent_onto_hits, 1u);
  EXPECT_EQ(b.onto_restores(), 1);
  // Another lane imports the whole state.
  const Ran third = RunJob(*c, b, 1, Cat(doc, Seq(700, 12)), {128, 140});
  EXPECT_EQ(third.start.restored, 128u);
  EXPECT_EQ(c->Stats().recurrent_onto_hits, 1u);
  ExpectConsistent(*c);
}

TEST(Hybrid, WhereACutIsDearTheGridGivesWayAndTheNamedRecordsStay) {
  const auto prompt = Seq(1, 150);
  const std::vector<size_t> ends = {100, 150};
  FakeBackend cheap_backend(Kind::kHybrid), dear_backend(Kind::kHybrid), some_backend(Kind::kHybrid);
  auto cheap = Make(cheap_backend);
  LaneCacheOptions o;
  o.grid_budget = 0.02;
  o.cut_cost_rows = 1000;  // no grid point is worth its batch
  auto dear = Make(dear_backend, o);
  o.cut_cost_rows = 1;  // 2% of 150 rows: three grid points
  auto some = Make(some_backend, o);
  const Ran all = RunJob(*cheap, cheap_backend, 0, prompt, ends);
  const Ran none = RunJob(*dear, dear_backend, 0, prompt, ends);
  const Ran three = RunJob(*some, some_backend, 0, prompt, ends);
  // The turn, the tail and the longest grid points (144 is next to the tail: 128) are recorded
  // whatever a cut costs; the grid points spread over the rest only within the budget.
  EXPECT_EQ(none.boundaries_seen, std::vector<size_t>({100, 128, 146}));
  EXPECT_EQ(three.boundaries_seen.size(), 6u);
  EXPECT_GT(all.boundaries_seen.size(), three.boundaries_seen.size());
  EXPECT_EQ(none.start.chunk_ends, std::vector<size_t>({100, 128, 146, 150}));
  // The next turn restores the turn record either way.
  EXPECT_EQ(RunJob(*dear, dear_backend, 1, Cat(Seq(1, 100), Seq(700, 30)), {100, 130}).start.restored, 100u);
}

// RecordAlso: a job waiting to restore a prefix another lane is prefilling gets a record where the
// prefix ends, added to the plan mid-prefill (the batches already run stay; the rest is cut again
// there), for the exact-boundary families; a dense family's prompt-end record already serves it.
// RecordsWithin tells beforehand what the waiting job will restore. Smallest batches of 2 and 16.
TEST(RecordAlso, AWaitingJobRestoresThePrefixEndAddedMidPrefill) {
  for (size_t min_batch : {size_t{2}, size_t{16}}) {
    for (Kind kind : {Kind::kHybrid, Kind::kSlidingWindow, Kind::kDense}) {
      SCOPED_TRACE(::testing::Message() << "kind " << static_cast<int>(kind) << ", min batch " << min_batch);
      FakeBackend b(kind, 2, min_batch);
      LaneCacheOptions o;
      o.prefill_chunk = 64;
      auto c = Make(b, o);
      const auto prompt = Seq(1, 300);  // records planned at 144 and 208 among others
      const JobStart start = c->Begin(0, "", prompt, {});
      ASSERT_EQ(start.restored, 0u);
      std::vector<size_t> ends = start.chunk_ends;
      size_t pos = 0;
      auto prefill_to = [&](size_t end) {
        // Through the backend's Prefill: every batch at least the smallest exact batch.
        ASSERT_TRUE(b.Prefill(0, std::span(prompt).subspan(pos, end - pos), static_cast<int32_t>(pos)).ok());
        pos = end;
        if (end < prompt.size()) c->AtBoundary(0, end);
      };
      prefill_to(ends[0]);
      EXPECT_FALSE(c->RecordAlso(0, pos, pos)) << "already prefilled";
      const LaneCache::SharedRecords before = c->RecordsWithin(0, 170, pos);
      EXPECT_EQ(before.later, 170u) << "what the waiting job will restore";
      EXPECT_LE(before.now, pos);
      if (kind == Kind::kHybrid) {
        EXPECT_EQ(before.now, 0u) << "a hybrid's boundaries become entries at the prompt end";
      }
      const std::optional<std::vector<size_t>> changed = c->RecordAlso(0, 170, pos);
      if (kind == Kind::kDense) {
        EXPECT_FALSE(changed) << "the prompt end serves every prefix";
      } else {
        ASSERT_TRUE(changed);
        EXPECT_EQ(changed->front(), ends[0]) << "a batch already run was planned again";
        EXPECT_TRUE(std::binary_search(changed->begin(), changed->end(), size_t{170}));
        EXPECT_EQ(changed->back(), prompt.size());
        EXPECT_FALSE(c->RecordAlso(0, 170, pos)) << "a record is added once";
        // One row past a planned record: both cannot be batch ends, and the planned one stays.
        EXPECT_FALSE(c->RecordAlso(0, 171, pos));
        EXPECT_EQ(c->RecordsWithin(0, 171, pos).later, 170u);
        ends = *changed;
      }
      for (size_t i = 1; i < ends.size(); ++i) prefill_to(ends[i]);
      if (kind == Kind::kSlidingWindow) {
        EXPECT_EQ(c->RecordsWithin(0, 170, pos).now, 170u) << "recorded at its boundary, before the first token";
      }
      c->AfterFirstToken(0, LogitsOf(prompt));
      const Token generated = 999;
      b.Append(0, std::span(&generated, 1));
      c->Finish(0, true);
      // Another lane restores the 170 tokens the two prompts share.
      EXPECT_EQ(RunJob(*c, b, 1, Cat(Seq(1, 170), Seq(900, 30))).start.restored, 170u);
      ExpectConsistent(*c);
    }
  }
}

// CutBatch: a scheduler short of time cuts the lane's next batch, and the cut moves so that both
// pieces keep a whole batch of their class (16 rows in the long run, 2 in the short one at the
// end); a batch that cannot keep two is not cut. The records stay where they were planned: the
// next job restores the whole prompt.
TEST(CutBatch, ABatchIsCutOnlyWhereBothPiecesKeepTheirClass) {
  for (Kind kind : {Kind::kHybrid, Kind::kSlidingWindow, Kind::kDense}) {
    SCOPED_TRACE(static_cast<int>(kind));
    FakeBackend b(kind, 2, /*min_batch=*/16);
    LaneCacheOptions o;
    o.prefill_chunk = 64;
    o.record_stride = 1000;  // no grid and no tail: the turn and the prompt end are the records
    o.record_tail = 0;
    auto made = LaneCache::Create(o, b);
    ASSERT_TRUE(made.ok()) << made.status();
    auto c = std::move(*made);
    // A long message of 100 tokens and a short one of 6: runs [0, 100) long and [100, 106) short.
    const auto prompt = Seq(1, 106);
    const JobStart start = c->Begin(0, "", prompt, std::vector<size_t>{100, 106});
    ASSERT_EQ(start.chunk_ends, std::vector<size_t>({50, 100, 106}));
    EXPECT_FALSE(c->CutBatch(0, 0, 50)) << "the batch already fits";
    EXPECT_EQ(c->CutBatch(0, 0, 1), std::vector<size_t>({16, 50, 100, 106})) << "raised to the smallest batch";
    EXPECT_EQ(c->CutBatch(0, 16, 30), std::vector<size_t>({16, 34, 50, 100, 106})) << "lowered to leave one";
    EXPECT_FALSE(c->CutBatch(0, 34, 4)) << "16 rows hold no two batches of 16";
    EXPECT_EQ(c->CutBatch(0, 50, 20), std::vector<size_t>({16, 34, 50, 70, 100, 106}));
    EXPECT_EQ(c->CutBatch(0, 100, 1), std::vector<size_t>({16, 34, 50, 70, 100, 102, 106})) << "the short class's 2";
    size_t pos = 0;
    for (size_t end : {16, 34, 50, 70, 100, 102, 106}) {
      b.Append(0, std::span(prompt).subspan(pos, end - pos));
      pos = end;
      if (end < prompt.size()) c->AtBoundary(0, end);
    }
    c->AfterFirstToken(0, LogitsOf(prompt));
    const Token generated = 999;
    b.Append(0, std::span(&generated, 1));
    c->Finish(0, true);
    EXPECT_EQ(RunJob(*c, b, 1, Cat(prompt, Seq(900, 30)), {100, 106, 136}).start.restored, prompt.size());
    ExpectConsistent(*c);
  }
}

// A record asked for near one already planned (less than a smallest batch away) is refused rather
// than cutting the planned one, and RecordsWithin says the planned one is what a job restores.
TEST(RecordAlso, APlannedRecordIsNotGivenUp) {
  for (Kind kind : {Kind::kHybrid, Kind::kSlidingWindow}) {
    SCOPED_TRACE(static_cast<int>(kind));
    FakeBackend b(kind, 2, /*min_batch=*/16);
    LaneCacheOptions o;
    o.prefill_chunk = 64;
    auto c = Make(b, o);
    const auto prompt = Seq(1, 300);
    const JobStart start = c->Begin(0, "", prompt, {});
    ASSERT_GE(start.chunk_ends.size(), 3u);
    const size_t pos = start.chunk_ends[0];
    ASSERT_TRUE(b.Prefill(0, std::span(prompt).first(pos), 0).ok());
    c->AtBoundary(0, pos);
    // A planned record well above pos: a batch end that RecordsWithin serves exactly.
    std::optional<size_t> planned;
    for (size_t e : start.chunk_ends) {
      if (e > pos + 32 && e < prompt.size() && c->RecordsWithin(0, e, pos).later == e) {
        planned = e;
        break;
      }
    }
    ASSERT_TRUE(planned) << "the plan records nothing above the first batch";
    for (size_t at : {*planned - 5, *planned + 5}) {
      EXPECT_FALSE(c->RecordAlso(0, at, pos)) << at;
      EXPECT_LT(c->RecordsWithin(0, at, pos).later, at) << at;
    }
    EXPECT_EQ(c->RecordsWithin(0, *planned + 5, pos).later, *planned);
  }
}

// A job that never began (cancelled while it waited) leaves its lane as it was: the prompt it
// kept still serves the next job.
TEST(LaneCache, FinishWithoutBeginKeepsTheLane) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b);
  const auto prompt = Seq(1, 100);
  RunJob(*c, b, 0, prompt);
  const std::vector<Token> held = b.kv(0);
  c->Finish(0, false);
  EXPECT_EQ(b.kv(0), held);
  EXPECT_EQ(RunJob(*c, b, 0, Cat(prompt, Seq(500, 20))).start.tier, "lane");
}

TEST(Recurrent, EntriesExistOnlyAtRecordedBoundaries) {
  FakeBackend b(Kind::kRecurrent);
  auto c = Make(b);
  EXPECT_EQ(c->strategy().name(), "recurrent");
  const auto doc = Seq(1, 96);
  const Ran first = RunJob(*c, b, 0, Cat(doc, Seq(500, 12)), {96, 108});
  const uint64_t records = c->Stats().records;
  EXPECT_GE(records, 2u);
  // The lane keeps nothing: the next job on it imports a stored state at a recorded boundary.
  const Ran second = RunJob(*c, b, 0, Cat(doc, Seq(600, 12)), {96, 108});
  EXPECT_EQ(second.start.restored, 96u);
  EXPECT_EQ(c->Stats().lane_hits, 0u);
  // A prompt that shares 50 tokens: no boundary there (a recurrent state cannot be cut back).
  const Ran third = RunJob(*c, b, 1, Cat(Seq(1, 50), Seq(900, 60)));
  EXPECT_TRUE(std::find(first.boundaries_seen.begin(), first.boundaries_seen.end(), third.start.restored) !=
                  first.boundaries_seen.end() ||
              third.start.restored == 0);
}

TEST(Disabled, CacheOffMissesRecordsNothingAndPlansTheSameBatches) {
  for (Kind kind : {Kind::kDense, Kind::kSlidingWindow, Kind::kHybrid, Kind::kRecurrent}) {
    FakeBackend on_backend(kind), off_backend(kind);
    auto on = Make(on_backend);
    LaneCacheOptions off_options;
    off_options.enabled = false;
    auto off = Make(off_backend, off_options);
    EXPECT_EQ(off->strategy().name(), "disabled");
    // skippy-server asks the facts before it makes the cache; both strategies must agree.
    EXPECT_EQ(on->strategy().plans_boundaries(), FamilyStrategy::PlansBoundaries(on_backend.facts()));
    EXPECT_EQ(off->strategy().plans_boundaries(), FamilyStrategy::PlansBoundaries(off_backend.facts()));
    const auto prompt = Seq(1, 150);
    const std::vector<size_t> ends = {100, 150};
    const Ran a = RunJob(*on, on_backend, 0, prompt, ends);
    const Ran b = RunJob(*off, off_backend, 0, prompt, ends);
    EXPECT_EQ(b.start.miss_reason, "cache-disabled");
    EXPECT_EQ(a.start.chunk_ends, b.start.chunk_ends) << "--no-cache must prefill in the same batches";
    const Ran again = RunJob(*off, off_backend, 0, prompt, ends);
    EXPECT_EQ(again.start.restored, 0u);
    EXPECT_EQ(off->Stats().records, 0u);
    EXPECT_EQ(off->Stats().cache.pool.index.entries, 0u);
    EXPECT_FALSE(off->Stats().enabled);
  }
}

TEST(Disabled, AnUncertifiedFamilyIsNeverServed) {
  FakeBackend b(Kind::kUncertified);
  auto c = Make(b);
  const Ran r = RunJob(*c, b, 0, Seq(1, 100));
  RunJob(*c, b, 0, Seq(1, 100));
  EXPECT_EQ(r.start.miss_reason, "cache-disabled");
  EXPECT_EQ(c->Stats().records, 0u);
  EXPECT_TRUE(b.kv(0).empty()) << "Finish clears a lane the cache does not keep";
}

TEST(LaneCache, ShortPromptsAreNeitherServedNorRecorded) {
  FakeBackend b(Kind::kDense, 2, /*min_batch=*/64);
  auto c = Make(b);
  RunJob(*c, b, 0, Seq(1, 40));
  const Ran r = RunJob(*c, b, 1, Seq(1, 40));
  EXPECT_EQ(r.start.miss_reason, "short-prompt");
  EXPECT_EQ(c->Stats().records, 0u);
}

TEST(LaneCache, NamespacesShareNeitherEntriesNorLanes) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b);
  const auto prompt = Cat(Seq(1, 100), Seq(500, 8));
  RunJob(*c, b, 0, prompt, {}, "tenant-a");
  const Ran other = RunJob(*c, b, 0, prompt, {}, "tenant-b");
  EXPECT_EQ(other.start.restored, 0u) << "tenant B was served tenant A's prefix";
  EXPECT_EQ(c->Stats().lane_hits, 0u);
  const Ran own = RunJob(*c, b, 1, prompt, {}, "tenant-a");
  EXPECT_GT(own.start.restored, 0u);
}

TEST(LaneCache, ClearDropsANamespacesEntriesAndItsLaneMemory) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b);
  const auto pa = Cat(Seq(1, 100), Seq(500, 8));
  const auto pb = Cat(Seq(2000, 100), Seq(500, 8));
  RunJob(*c, b, 0, pa, {}, "a");
  RunJob(*c, b, 1, pb, {}, "b");
  EXPECT_EQ(c->Clear(std::string("a")), 1u);
  const Ran a_again = RunJob(*c, b, 0, pa, {}, "a");
  EXPECT_EQ(a_again.start.restored, 0u) << "served after its namespace was cleared";
  const Ran b_again = RunJob(*c, b, 0, pb, {}, "b");
  EXPECT_GT(b_again.start.restored, 0u) << "another namespace's entries went too";
  ExpectConsistent(*c);
}

TEST(LaneCache, AFailedImportIsAMissWithAClearedLane) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b);
  const auto doc = Seq(1, 100);
  RunJob(*c, b, 0, Cat(doc, Seq(500, 8)));
  b.FailImports(true);
  const JobStart s = c->Begin(1, "", Cat(doc, Seq(600, 8)), {});
  EXPECT_EQ(s.miss_reason, "restore-failed");
  EXPECT_EQ(s.restored, 0u);
  EXPECT_TRUE(b.kv(1).empty());
  c->Finish(1, false);
}

TEST(LaneCache, AnUnfinishedJobLeavesItsLaneCleared) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b);
  const auto prompt = Seq(1, 100);
  const JobStart s = c->Begin(0, "", prompt, {});
  b.Append(0, std::span(prompt).first(s.chunk_ends.front()));
  c->Finish(0, false);  // cancelled mid-prefill
  EXPECT_TRUE(b.kv(0).empty());
  EXPECT_EQ(c->Stats().records, 0u);
}

TEST(LaneCache, CapsEvictOldEntriesAndKeepEveryPayloadOwned) {
  FakeBackend b(Kind::kRecurrent);
  LaneCacheOptions o;
  o.max_entries = 6;
  auto c = Make(b, o);
  for (Token i = 0; i < 20; ++i) RunJob(*c, b, i % 2, Seq(1000 * (i + 1), 100), {80, 100});
  const LaneCacheStats s = c->Stats();
  EXPECT_LE(s.cache.pool.index.entries, 6u);
  EXPECT_GT(s.evictions, 0u);
  ExpectConsistent(*c);
}

// Answer prefill. A decoded token is a batch class of its own (smallest exact batch 2), so the
// tokens a job generated into its lane (AppendDecoded marks them) are not what a recompute of the
// next turn holds there. Between jobs the lane computes them again as prompt rows, one batch of at
// most max_rows per IdleStep, and records the exchange; the next turn then restores the answer too.
LaneCacheOptions AnswerPrefill() {
  LaneCacheOptions o;
  o.answer_prefill = true;
  return o;
}

// A conversation's next turn on `lane`: the previous prompt, the answer and a new question.
Ran NextTurn(LaneCache& c, FakeBackend& b, int32_t lane, const std::vector<Token>& prompt,
             const std::vector<Token>& answer, Token question = 7000) {
  return RunJob(c, b, lane, Cat(Cat(prompt, answer), Seq(question, 12)));
}

// A job restored `n` tokens of its prompt from `tier`.
void ExpectRestored(const Ran& r, size_t n, std::string_view tier) {
  EXPECT_EQ(r.start.restored, n);
  EXPECT_EQ(r.start.tier, tier);
}

// A cache with answer prefill on, after one turn on lane 0: `prompt` answered with `answer`,
// decoded one row at a time.
struct Answered {
  explicit Answered(Kind kind) : b(kind) {
    c = Make(b, AnswerPrefill());
    RunTurn(*c, b, 0, prompt, answer);
  }
  FakeBackend b;
  std::unique_ptr<LaneCache> c;
  const std::vector<Token> prompt = Seq(1, 100);
  const std::vector<Token> answer = Seq(5000, 21);
};

// IdleStep until no work is left; the steps taken.
int Idle(LaneCache& c, size_t max_rows) {
  int steps = 0;
  while (c.HasIdleWork() && steps < 100) {
    c.IdleStep(max_rows);
    ++steps;
  }
  return steps;
}

TEST(AnswerPrefill, ADenseLaneComputesItsAnswerAsPromptRowsAndTheNextTurnRestoresIt) {
  Answered t(Kind::kDense);
  auto& [b, c, prompt, answer] = t;
  EXPECT_EQ(b.kv(0), prompt) << "the decoded rows are cut off first";
  ASSERT_TRUE(c->HasIdleWork());
  const int before = b.prefills();
  // 21 rows in batches of at most 8, the last one keeping 2+ rows: 8, 8, 5.
  EXPECT_EQ(Idle(*c, 8), 3);
  EXPECT_EQ(b.prefills() - before, 3);
  EXPECT_EQ(b.kv(0), Cat(prompt, answer)) << "the lane holds the exchange as prompt rows";
  EXPECT_EQ(c->Stats().answer_prefill_tokens, 21u);
  EXPECT_EQ(c->Stats().answer_records, 1u);
  // The next turn, on another lane: the exchange entry restores prompt and answer (RunTurn checks
  // the lane holds exactly what a recompute would).
  ExpectRestored(NextTurn(*c, b, 1, prompt, answer), 121u, "memory");
  ExpectConsistent(*c);
}

TEST(AnswerPrefill, NoBatchIsLongerThanThePrefillChunk) {
  // The engine cuts a batch longer than n_batch (>= the chunk) again, maybe leaving a row alone.
  FakeBackend b(Kind::kDense);
  LaneCacheOptions o = AnswerPrefill();
  o.prefill_chunk = 8;
  auto c = Make(b, o);
  RunTurn(*c, b, 0, Seq(1, 100), Seq(5000, 21));
  const int before = b.prefills();
  EXPECT_EQ(Idle(*c, 1000), 3);  // 8, 8, 5 rows, as with max_rows 8
  EXPECT_EQ(b.prefills() - before, 3);
  ExpectConsistent(*c);
}

TEST(AnswerPrefill, OffOrWhereDecodedRowsCannotBeRecomputedThereIsNoWork) {
  const auto prompt = Seq(1, 100);
  const auto answer = Seq(5000, 21);
  {
    FakeBackend b(Kind::kDense);
    auto c = Make(b);  // answer_prefill off
    RunTurn(*c, b, 0, prompt, answer);
    EXPECT_FALSE(c->HasIdleWork());
    EXPECT_EQ(NextTurn(*c, b, 0, prompt, answer).start.restored, 100u);
  }
  {
    // A long class of 64+ rows (stock kernels, flash attention on): a prompt's classes depend on
    // its messages, which the next turn's are not known yet.
    FakeBackend b(Kind::kDense, 2, /*min_batch=*/64);
    auto c = Make(b, AnswerPrefill());
    RunTurn(*c, b, 0, Seq(1, 200), answer);
    EXPECT_FALSE(c->HasIdleWork());
  }
  {
    // A one-token answer is below the smallest exact batch.
    FakeBackend b(Kind::kDense);
    auto c = Make(b, AnswerPrefill());
    RunTurn(*c, b, 0, prompt, Seq(5000, 1));
    EXPECT_FALSE(c->HasIdleWork());
  }
  {
    // Cache off: nothing is served, nothing is kept.
    FakeBackend b(Kind::kDense);
    LaneCacheOptions o = AnswerPrefill();
    o.enabled = false;
    auto c = Make(b, o);
    RunTurn(*c, b, 0, prompt, answer);
    EXPECT_FALSE(c->HasIdleWork());
  }
}

TEST(AnswerPrefill, ANextTurnOnTheLaneTakesWhatIsDoneAndComputesTheRest) {
  Answered t(Kind::kDense);
  auto& [b, c, prompt, answer] = t;
  c->IdleStep(8);
  EXPECT_EQ(b.kv(0), Cat(prompt, Seq(5000, 8)));
  ExpectRestored(NextTurn(*c, b, 0, prompt, answer), 108u, "lane");
  EXPECT_EQ(c->Stats().answers_dropped, 0u) << "the next turn computed the rest";
  EXPECT_EQ(c->Stats().answer_records, 0u);
  EXPECT_FALSE(c->HasIdleWork());
}

// One lane, conversations interleaved: another conversation takes the lane before the answer is
// prefilled. The answer waits; once the lanes are idle its prompt's entry comes back into a lane
// (the oldest answer first: the lane's own waits meanwhile), the answer is prefilled there and the
// exchange recorded, so its next turn still restores it.
TEST(AnswerPrefill, AnAnswerWhoseLaneAnotherConversationTookWaitsForIdleTime) {
  for (Kind kind : {Kind::kDense, Kind::kHybrid}) {
    SCOPED_TRACE(kind == Kind::kDense ? "dense" : "hybrid");
    FakeBackend b(kind, /*lanes=*/1);
    auto c = Make(b, AnswerPrefill());
    const auto a = Seq(1, 100), a_answer = Seq(5000, 21);
    // The other conversation shares a's first 60 tokens (a system prompt), which the lane serves.
    const auto other = Cat(Seq(1, 60), Seq(20000, 30)), other_answer = Seq(6000, 9);
    RunTurn(*c, b, 0, a, a_answer);
    c->IdleStep(8);  // a third of it before the next request
    const Ran taken = RunTurn(*c, b, 0, other, other_answer);
    if (kind == Kind::kDense) ExpectRestored(taken, 60u, "lane");
    EXPECT_EQ(Idle(*c, 64), 4) << "each answer: its prompt imported, then its one batch";
    EXPECT_EQ(b.kv(0), Cat(other, other_answer)) << "the newest answer went last";
    EXPECT_EQ(c->Stats().answer_records, 2u);
    EXPECT_EQ(c->Stats().answers_dropped, 0u);
    ExpectRestored(NextTurn(*c, b, 0, a, a_answer), 121u, "memory");
    ExpectRestored(NextTurn(*c, b, 0, other, other_answer, 8000), 99u, "memory");
    ExpectConsistent(*c);
  }
}

TEST(AnswerPrefill, TheDeferredQueueKeepsTheNewestAnswers) {
  FakeBackend b(Kind::kDense, /*lanes=*/1);
  auto c = Make(b, AnswerPrefill());
  // Nine conversations on one lane, none idle in between: the queue keeps 4 (and the lane its own).
  for (Token i = 0; i < 9; ++i) RunTurn(*c, b, 0, Seq(1000 * (i + 1), 100), Seq(20000 + 100 * i, 10));
  EXPECT_EQ(c->Stats().answers_dropped, 4u);
  Idle(*c, 64);
  EXPECT_EQ(c->Stats().answer_records, 5u);
  EXPECT_EQ(NextTurn(*c, b, 0, Seq(1000, 100), Seq(20000, 10)).start.restored, 100u)
      << "the oldest answer was dropped";
  EXPECT_EQ(NextTurn(*c, b, 0, Seq(5000, 100), Seq(20400, 10)).start.restored, 110u);
}

TEST(AnswerPrefill, AClearedNamespacesAnswerIsDropped) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b, AnswerPrefill());
  RunTurn(*c, b, 0, Seq(1, 100), Seq(5000, 21), {}, "tenant");
  c->Clear(std::string("tenant"));
  const int before = b.prefills();
  EXPECT_EQ(Idle(*c, 8), 1);
  EXPECT_EQ(b.prefills(), before);
  EXPECT_EQ(c->Stats().answers_dropped, 1u);
  EXPECT_EQ(c->Stats().answer_records, 0u);
}

// A hybrid lane cannot be cut back: its recurrent state has moved past the decoded rows. The
// prompt end's recurrent state comes back from its entry, onto the lane's attention KV cut to the
// prompt, and the answer is prefilled from there; the next turn continues the lane.
TEST(AnswerPrefill, AHybridLaneRewindsToThePromptEndFirst) {
  Answered t(Kind::kHybrid);
  auto& [b, c, prompt, answer] = t;
  EXPECT_EQ(b.kv(0).size(), 121u) << "the decoded rows stay until the idle work";
  const int onto = b.onto_restores();
  EXPECT_EQ(Idle(*c, 8), 3);
  EXPECT_EQ(b.onto_restores(), onto + 1);
  EXPECT_EQ(b.kv(0), Cat(prompt, answer));
  EXPECT_EQ(b.recurrent(0), FakeBackend::Chain(Cat(prompt, answer))) << "the state is a recompute's";
  EXPECT_EQ(c->Stats().answer_records, 1u);
  ExpectRestored(NextTurn(*c, b, 0, prompt, answer), 121u, "lane");
  // Another lane restores the exchange from its entry (a whole-state import).
  ExpectRestored(NextTurn(*c, b, 1, prompt, answer, 8000), 121u, "memory");
  ExpectConsistent(*c);
}

TEST(AnswerPrefill, AHybridLaneWithoutThePromptEndsEntryKeepsItsDecodedRows) {
  FakeBackend b(Kind::kHybrid);
  LaneCacheOptions o = AnswerPrefill();
  o.max_entries = 1;  // the prompt end's entry is evicted by the next record
  auto c = Make(b, o);
  const auto prompt = Seq(1, 100);
  RunTurn(*c, b, 0, prompt, Seq(5000, 21));
  RunJob(*c, b, 1, Seq(9000, 100));
  ASSERT_TRUE(c->HasIdleWork());
  const int before = b.prefills();
  EXPECT_EQ(Idle(*c, 8), 1);
  EXPECT_EQ(b.prefills(), before);
  EXPECT_EQ(b.kv(0).size(), 121u);
  EXPECT_EQ(c->Stats().answers_dropped, 1u);
}

// A chat's next turn holds the reply as the client sends it back, tokenized anew (here other
// tokens than the 21 generated), and the template's end of turn and next header: that is what the
// idle work prefills after the prompt, asked for once, so the whole of it is restored.
TEST(AnswerPrefill, AChatsAnswerIsWhatItsNextTurnHoldsAfterThePrompt) {
  for (Kind kind : {Kind::kDense, Kind::kHybrid}) {
    SCOPED_TRACE(kind == Kind::kDense ? "dense" : "hybrid");
    FakeBackend b(kind);
    auto c = Make(b, AnswerPrefill());
    const auto prompt = Seq(1, 100);
    const auto reply = Cat(Seq(7000, 18), Seq(9900, 5));  // retokenized reply, then the template's
    int asked = 0;
    RunTurn(*c, b, 0, prompt, Seq(5000, 21), {}, "", [&]() -> std::optional<std::vector<Token>> {
      ++asked;
      return Cat(prompt, reply);
    });
    EXPECT_EQ(asked, 0) << "asked in idle time, not when the job finishes";
    EXPECT_EQ(Idle(*c, 8), 3);
    EXPECT_EQ(asked, 1);
    EXPECT_EQ(b.kv(0), Cat(prompt, reply));
    if (kind == Kind::kHybrid) {
      EXPECT_EQ(b.recurrent(0), FakeBackend::Chain(Cat(prompt, reply)));
    }
    EXPECT_EQ(c->Stats().answer_prefill_tokens, 23u);
    ExpectRestored(NextTurn(*c, b, 0, prompt, reply), 123u, "lane");
    ExpectRestored(NextTurn(*c, b, 1, prompt, reply, 8000), 123u, "memory");
    ExpectConsistent(*c);
  }
}

TEST(AnswerPrefill, AChatAnswerIsDroppedWhereItsNextTurnDoesNotStartWithThePrompt) {
  const auto prompt = Seq(1, 100), answer = Seq(5000, 21);
  for (Kind kind : {Kind::kDense, Kind::kHybrid}) {
    SCOPED_TRACE(kind == Kind::kDense ? "dense" : "hybrid");
    FakeBackend b(kind);
    auto c = Make(b, AnswerPrefill());
    // The template renders the prompt's last tokens otherwise once an answer follows them.
    RunTurn(*c, b, 0, prompt, answer, {}, "", [&]() -> std::optional<std::vector<Token>> {
      return Cat(Seq(1, 97), Seq(7000, 30));
    });
    const int before = b.prefills();
    EXPECT_EQ(Idle(*c, 8), 1);
    EXPECT_EQ(b.prefills(), before);
    EXPECT_EQ(c->Stats().answers_dropped, 1u);
    EXPECT_EQ(b.kv(0).size(), kind == Kind::kDense ? 100u : 121u) << "the lane holds what it held";
  }
  {
    // Not known (nullopt): the generated tokens are the answer.
    FakeBackend b(Kind::kDense);
    auto c = Make(b, AnswerPrefill());
    RunTurn(*c, b, 0, prompt, answer, {}, "", [] { return std::optional<std::vector<Token>>(); });
    Idle(*c, 64);
    EXPECT_EQ(b.kv(0), Cat(prompt, answer));
  }
  {
    // Before it is asked, a job whose prompt extends the lane's is the next turn: it computes the
    // reply itself and nothing waits for idle time.
    FakeBackend b(Kind::kDense, /*lanes=*/1);
    auto c = Make(b, AnswerPrefill());
    bool asked = false;
    RunTurn(*c, b, 0, prompt, answer, {}, "", [&]() -> std::optional<std::vector<Token>> {
      asked = true;
      return std::nullopt;
    });
    ExpectRestored(RunJob(*c, b, 0, Cat(prompt, Seq(7000, 40))), 100u, "lane");
    EXPECT_FALSE(c->HasIdleWork());
    EXPECT_FALSE(asked);
    EXPECT_EQ(c->Stats().answers_dropped, 0u);
  }
}

// In the one-row class (smallest exact batch 1) a lane keeps its answer as decoded and records the
// exchange when the job finishes. Where the next turn holds other tokens after the prompt (a reply
// that tokenizes otherwise, the template's end of turn and next header), idle work asks it once
// and prefills the difference: a dense lane is cut back to where the two part; a hybrid lane
// prefills on from all it holds when the next turn extends it, else gets the prompt end's recurrent
// state back first. Where the next turn holds just the answer, or is not known, nothing is done.
TEST(AnswerPrefill, InTheOneRowClassTheLaneKeepsItsAnswerAndPrefillsWhatTheNextTurnHoldsBesides) {
  const auto prompt = Seq(1, 100), answer = Seq(5000, 21);
  struct Case {
    const char* name;
    std::vector<Token> after_prompt;  // what the next turn holds after the prompt
    size_t prefilled;                 // rows the idle work computes (dense)
  };
  const Case cases[] = {
      {"the template's end of turn and header after the answer", Cat(answer, Seq(9900, 5)), 5},
      {"a reply that tokenizes otherwise from its 16th token", Cat(Seq(5000, 15), Seq(7000, 8)), 8},
      // A dense lane serves any prefix of what it holds; a hybrid one computes the prefix again.
      {"a next turn that stops inside the answer", Seq(5000, 15), 0},
  };
  auto strict_prefix = [&](const Case& k) {
    return k.after_prompt.size() < answer.size() && std::equal(k.after_prompt.begin(), k.after_prompt.end(), answer.begin());
  };
  for (Kind kind : {Kind::kDense, Kind::kHybrid}) {
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(kind == Kind::kDense ? "dense: " : "hybrid: ") + k.name);
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = Make(b, AnswerPrefill());
      int asked = 0;
      RunTurn(*c, b, 0, prompt, answer, {}, "", [&]() -> std::optional<std::vector<Token>> {
        ++asked;
        return Cat(prompt, k.after_prompt);
      });
      EXPECT_EQ(b.kv(0), Cat(prompt, answer)) << "the lane keeps the answer as decoded";
      EXPECT_EQ(c->Stats().answer_records, 0u) << "the exchange is recorded in idle time, not as the job finishes";
      EXPECT_EQ(asked, 0) << "asked in idle time, not when the job finishes";
      EXPECT_EQ(c->Stats().answers_pending, 1u);
      c->IdleStep(64);
      EXPECT_EQ(c->Stats().answer_records, 1u) << "the first idle step records the exchange";
      EXPECT_EQ(asked, 0) << "and does nothing else";
      const int onto = b.onto_restores();
      Idle(*c, 64);
      EXPECT_EQ(asked, 1);
      EXPECT_EQ(c->Stats().answers_pending, 0u);
      const bool dense_holds_it = kind == Kind::kDense && strict_prefix(k);
      EXPECT_EQ(b.kv(0), dense_holds_it ? Cat(prompt, answer) : Cat(prompt, k.after_prompt));
      if (kind == Kind::kDense) {
        EXPECT_EQ(c->Stats().answer_prefill_tokens, k.prefilled);
      } else {
        EXPECT_EQ(b.recurrent(0), FakeBackend::Chain(Cat(prompt, k.after_prompt))) << "the state is a recompute's";
        const bool extends = k.after_prompt.size() > answer.size() &&
                             std::equal(answer.begin(), answer.end(), k.after_prompt.begin());
        EXPECT_EQ(b.onto_restores(), onto + (extends ? 0 : 1));
        EXPECT_EQ(c->Stats().answer_prefill_tokens, extends ? k.prefilled : k.after_prompt.size());
      }
      EXPECT_EQ(c->Stats().answer_records, dense_holds_it ? 1u : 2u);
      EXPECT_EQ(c->Stats().answers_dropped, 0u);
      const size_t n = prompt.size() + k.after_prompt.size();
      ExpectRestored(NextTurn(*c, b, 0, prompt, k.after_prompt), n, "lane");
      ExpectRestored(NextTurn(*c, b, 1, prompt, k.after_prompt, 8000), n, "memory");
      ExpectConsistent(*c);
    }
  }
  // Another conversation takes the lane before idle time: the kept answer waits in the deferred
  // queue and is resumed on an idle lane from the exchange's entry where that serves the start of
  // what the next turn holds (a dense one any prefix of the answer, a hybrid one all of it), else
  // from the prompt's; the next turn then restores all it holds from memory.
  for (Kind kind : {Kind::kDense, Kind::kHybrid}) {
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(kind == Kind::kDense ? "deferred, dense: " : "deferred, hybrid: ") + k.name);
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = Make(b, AnswerPrefill());
      RunTurn(*c, b, 0, prompt, answer, {}, "", [&]() -> std::optional<std::vector<Token>> {
        return Cat(prompt, k.after_prompt);
      });
      RunJob(*c, b, 0, Seq(9000, 100));
      EXPECT_EQ(c->Stats().answers_pending, 1u) << "deferred";
      Idle(*c, 64);
      EXPECT_EQ(c->Stats().answers_pending, 0u);
      EXPECT_EQ(c->Stats().answers_dropped, 0u);
      const bool extends = k.after_prompt.size() > answer.size() &&
                           std::equal(answer.begin(), answer.end(), k.after_prompt.begin());
      EXPECT_EQ(c->Stats().answer_prefill_tokens,
                kind == Kind::kDense || extends ? k.prefilled : k.after_prompt.size());
      ExpectRestored(NextTurn(*c, b, 0, prompt, k.after_prompt, 8000), prompt.size() + k.after_prompt.size(), "memory");
      ExpectConsistent(*c);
    }
  }
  {
    // A hybrid lane whose prompt entry is gone (the cache keeps one entry, the exchange's) cannot
    // go back to the prompt end: it keeps the exchange it holds and serves a turn that extends it.
    SCOPED_TRACE("hybrid, the prompt's entry evicted");
    FakeBackend b(Kind::kHybrid, 2, /*min_batch=*/1);
    LaneCacheOptions o = AnswerPrefill();
    o.max_entries = 1;
    auto c = Make(b, o);
    RunTurn(*c, b, 0, prompt, answer, {}, "", [&]() -> std::optional<std::vector<Token>> {
      return Cat(prompt, cases[1].after_prompt);
    });
    Idle(*c, 64);
    EXPECT_EQ(c->Stats().answers_pending, 0u);
    EXPECT_EQ(c->Stats().answers_dropped, 1u);
    EXPECT_EQ(b.kv(0), Cat(prompt, answer));
    EXPECT_EQ(b.recurrent(0), FakeBackend::Chain(Cat(prompt, answer)));
    ExpectRestored(NextTurn(*c, b, 0, prompt, answer), prompt.size() + answer.size(), "lane");
    ExpectConsistent(*c);
  }
  for (const bool known : {true, false}) {
    SCOPED_TRACE(known ? "the next turn holds just the answer" : "the next turn is not known");
    FakeBackend b(Kind::kDense, 2, /*min_batch=*/1);
    auto c = Make(b, AnswerPrefill());
    RunTurn(*c, b, 0, prompt, answer, {}, "", [&]() -> std::optional<std::vector<Token>> {
      if (!known) return std::nullopt;
      return Cat(prompt, answer);
    });
    ASSERT_TRUE(c->HasIdleWork());
    const int before = b.prefills();
    EXPECT_EQ(Idle(*c, 64), 2) << "the exchange's record, then the next turn's check";
    EXPECT_EQ(b.prefills(), before);
    EXPECT_EQ(b.kv(0), Cat(prompt, answer));
    EXPECT_EQ(c->Stats().answer_records, 1u);
    EXPECT_EQ(c->Stats().answers_dropped, 0u);
  }
}

// In the one-row class the exchange a job leaves in its lane is recorded off the job's response:
// when the scheduler asks (RecordExchanges), else in idle time or before the next job on any lane
// changes a lane. Without idle work, as the job finishes.
TEST(AnswerPrefill, AnExchangeLeftUnrecordedIsRecordedBeforeAnyLaneChanges) {
  const auto prompt = Seq(1, 100), answer = Seq(5000, 21);
  const size_t n = prompt.size() + answer.size();
  // A one-row-class cache whose lane 0 has answered `prompt` with `answer`.
  auto answered = [&](FakeBackend& b) {
    auto c = Make(b, AnswerPrefill());
    RunTurn(*c, b, 0, prompt, answer);
    return c;
  };
  for (Kind kind : {Kind::kDense, Kind::kHybrid}) {
    SCOPED_TRACE(kind == Kind::kDense ? "dense" : "hybrid");
    {
      SCOPED_TRACE("the next turn on another lane, no idle time between");
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = answered(b);
      EXPECT_EQ(c->Stats().answer_records, 0u);
      EXPECT_TRUE(c->HasIdleWork());
      ExpectRestored(NextTurn(*c, b, 1, prompt, answer), n, "memory");
      EXPECT_EQ(c->Stats().answer_records, 1u);
      EXPECT_EQ(b.kv(0), Cat(prompt, answer)) << "lane 0 is untouched";
      ExpectConsistent(*c);
    }
    {
      SCOPED_TRACE("another conversation takes the lane");
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = answered(b);
      RunJob(*c, b, 0, Seq(9000, 100));
      EXPECT_EQ(c->Stats().answer_records, 1u);
      ExpectRestored(NextTurn(*c, b, 1, prompt, answer), n, "memory");
      ExpectConsistent(*c);
    }
    {
      SCOPED_TRACE("the next turn on the same lane");
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = answered(b);
      ExpectRestored(NextTurn(*c, b, 0, prompt, answer), n, "lane");
      EXPECT_EQ(c->Stats().answer_records, 1u) << "recorded before the lane goes on";
      EXPECT_FALSE(c->HasIdleWork());
      ExpectRestored(NextTurn(*c, b, 1, prompt, answer, 8000), n, "memory");
      ExpectConsistent(*c);
    }
    {
      SCOPED_TRACE("the scheduler asks once the response is out");
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = answered(b);
      EXPECT_EQ(c->Stats().answers_pending, 1u);
      c->RecordExchanges();
      EXPECT_EQ(c->Stats().answer_records, 1u);
      EXPECT_EQ(c->Stats().answers_pending, 0u) << "nothing else to do: the next turn is not known";
      EXPECT_EQ(b.kv(0), Cat(prompt, answer));
      ExpectRestored(NextTurn(*c, b, 1, prompt, answer), n, "memory");
      ExpectConsistent(*c);
    }
    {
      SCOPED_TRACE("a Clear of the namespace before idle time");
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = answered(b);
      c->Clear(std::nullopt);
      Idle(*c, 64);
      EXPECT_EQ(c->Stats().answer_records, 0u) << "a cleared exchange is not recorded";
      EXPECT_EQ(c->Stats().cache.pool.index.entries, 0u);
    }
    {
      SCOPED_TRACE("without idle work");
      FakeBackend b(kind, 2, /*min_batch=*/1);
      auto c = Make(b);
      RunTurn(*c, b, 0, prompt, answer);
      EXPECT_EQ(c->Stats().answer_records, 1u) << "recorded as the job finishes";
      EXPECT_FALSE(c->HasIdleWork());
    }
  }
}

// A tier eviction that reaches an entry a lookup has pinned: the entry goes once the pin is
// dropped, and its payload is not given back twice.
TEST(Recorder, TierEvictionOfAPinnedEntryFreesItOnRelease) {
  FakeBackend b(Kind::kRecurrent);
  cache::CacheOptions co;
  co.pool.seq_id_begin = co.pool.seq_id_end = 2;
  co.pool.lane_count = 2;
  auto core = std::move(*cache::Cache::Create(co));
  // Room for one state of 100 tokens (8 + 8 + 400 + 8 bytes) and not two.
  auto tier = std::move(*cache::PayloadStore::Create({64, 700, 2}));
  EntryTable entries;
  LaneCacheCounters counters;
  Recorder rec(b, *core, *tier, entries, counters);
  cache::PrefixScope scope;
  scope.config = b.facts().identity;
  const auto a = Seq(1, 100), bb = Seq(5000, 100);
  const auto classes = cache::BatchClasses::Of(100, {}, 2);
  b.Append(0, a);
  rec.Recurrent(0, scope, a, classes);
  ASSERT_EQ(counters.records, 1u);
  auto hit = core->Lookup(scope, a);
  ASSERT_TRUE(hit.ok() && hit->hit());
  (void)b.Clear(0);
  b.Append(0, bb);
  rec.Recurrent(0, scope, bb, classes);  // the tier evicts a's payload; a is pinned
  EXPECT_EQ(counters.records, 2u);
  EXPECT_EQ(counters.evictions, 1u);
  EXPECT_EQ(entries.size(), 2u) << "a pinned entry stays until its pin is dropped";
  EXPECT_EQ(tier->Stats().payloads, 1u);
  rec.Release(hit->match->entry.id);
  EXPECT_EQ(entries.size(), 1u);
  EXPECT_EQ(core->Stats().pool.index.entries, 1u);
  EXPECT_TRUE(core->CheckInvariants().ok());
  EXPECT_TRUE(tier->CheckInvariants().ok());
  EXPECT_FALSE(core->Lookup(scope, a)->hit());
}

}  // namespace
}  // namespace skippy::lane_cache

namespace skippy::lane_cache {
namespace {

class DiskTierLanes : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("skippy-lane-disk-" + std::to_string(::getpid()) + "-" + std::to_string(static_cast<int>(GetParam())));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  LaneCacheOptions Options() const {
    LaneCacheOptions o;
    o.disk_dir = dir_.string();
    o.disk_min_free_bytes = 0;
    return o;
  }
  std::filesystem::path dir_;
};

// A second LaneCache on the same directory (a restarted server) restores what the first recorded,
// from disk, and the lane holds what a recompute holds (RunJob checks the KV and recurrent state).
TEST_P(DiskTierLanes, ANewCacheOnTheDirectoryRestoresFromDisk) {
  const auto doc = Seq(1, 128);
  const std::vector<size_t> ends = {128, 140};
  {
    FakeBackend b(GetParam());
    auto c = Make(b, Options());
    RunJob(*c, b, 0, Cat(doc, Seq(500, 12)), ends);
    c->FlushTiers();
    EXPECT_GE(c->Stats().disk->writes, 1u);
  }
  FakeBackend b(GetParam());
  auto c = Make(b, Options());
  EXPECT_GE(c->Stats().disk->loaded_at_open, 1u);
  const Ran again = RunJob(*c, b, 0, Cat(doc, Seq(600, 12)), ends);
  EXPECT_EQ(again.start.miss_reason, "");
  EXPECT_EQ(again.start.tier, "disk");
  EXPECT_EQ(again.start.restored, 128u);
  EXPECT_EQ(c->Stats().disk_hits, 1u);
  // What came back from disk is a RAM entry now: another lane gets it from memory.
  const Ran other = RunJob(*c, b, 1, Cat(doc, Seq(700, 12)), ends);
  EXPECT_EQ(other.start.tier, "memory");
  EXPECT_EQ(c->Stats().disk_hits, 1u);
  ExpectConsistent(*c);
}

// Clear reaches the disk: a namespace cleared is not served after a restart either.
TEST_P(DiskTierLanes, ClearRemovesTheNamespacesDiskEntries) {
  const auto doc = Seq(1, 128);
  const std::vector<size_t> ends = {128, 140};
  {
    FakeBackend b(GetParam());
    auto c = Make(b, Options());
    RunJob(*c, b, 0, Cat(doc, Seq(500, 12)), ends, "tenant");
    c->FlushTiers();
    c->Clear(std::string("tenant"));
    EXPECT_EQ(c->Stats().disk->entries, 0u);
  }
  FakeBackend b(GetParam());
  auto c = Make(b, Options());
  const Ran again = RunJob(*c, b, 0, Cat(doc, Seq(600, 12)), ends, "tenant");
  EXPECT_NE(again.start.tier, "disk");
  EXPECT_EQ(c->Stats().disk_hits, 0u);
}

INSTANTIATE_TEST_SUITE_P(Families, DiskTierLanes, ::testing::Values(Kind::kDense, Kind::kSlidingWindow, Kind::kHybrid, Kind::kRecurrent));

}  // namespace
}  // namespace skippy::lane_cache

namespace skippy::lane_cache {
namespace {

using skippy::testing::RedisServer;

class SharedTierLanes : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    redis_ = RedisServer::Start();
    ASSERT_NE(redis_, nullptr);
  }
  LaneCacheOptions Options() const {
    LaneCacheOptions o;
    cache::SharedTierOptions s;
    s.port = redis_->port();
    s.password = RedisServer::kPassword;
    s.timeout_ms = 5000;  // a loaded CI machine must not turn writes into drops
    o.shared = s;
    return o;
  }
  std::unique_ptr<RedisServer> redis_;
};

// Two replicas on one Redis: what the first records, the second restores from the shared tier,
// and its lane holds what a recompute holds (RunJob checks the KV and recurrent state). Tenants
// stay apart across replicas.
TEST_P(SharedTierLanes, AnotherReplicaRestoresFromTheSharedTier) {
  const auto doc = Seq(1, 128);
  const std::vector<size_t> ends = {128, 140};
  FakeBackend b1(GetParam());
  auto first = Make(b1, Options());
  RunJob(*first, b1, 0, Cat(doc, Seq(500, 12)), ends, "tenant-a");
  first->FlushTiers();
  EXPECT_GE(first->Stats().shared->writes, 1u);

  FakeBackend b2(GetParam());
  auto second = Make(b2, Options());
  EXPECT_GE(second->Stats().shared->loaded_at_open, 1u);
  const Ran other_tenant = RunJob(*second, b2, 0, Cat(doc, Seq(600, 12)), ends, "tenant-b");
  EXPECT_NE(other_tenant.start.tier, "shared");
  const Ran again = RunJob(*second, b2, 1, Cat(doc, Seq(600, 12)), ends, "tenant-a");
  EXPECT_EQ(again.start.miss_reason, "");
  EXPECT_EQ(again.start.tier, "shared");
  EXPECT_EQ(again.start.restored, 128u);
  EXPECT_EQ(second->Stats().shared_hits, 1u);
  // Every kind counts the import it made (a whole-state import of a recurrent model included).
  EXPECT_EQ(second->Stats().stored_hits + second->Stats().recurrent_onto_hits, 1u);
  ExpectConsistent(*second);
}

// With a disk and a shared tier, an entry read from Redis is written to the local disk too, so a
// restart of this replica finds it on disk without Redis; and Redis down is a plain miss.
TEST_P(SharedTierLanes, ASharedHitIsKeptOnDiskAndRedisDownIsAMiss) {
  const auto doc = Seq(1, 128);
  const std::vector<size_t> ends = {128, 140};
  const auto dir = std::filesystem::temp_directory_path() /
                   ("skippy-lane-shared-" + std::to_string(::getpid()) + "-" + std::to_string(static_cast<int>(GetParam())));
  std::filesystem::remove_all(dir);
  {
    FakeBackend b1(GetParam());
    auto first = Make(b1, Options());
    RunJob(*first, b1, 0, Cat(doc, Seq(500, 12)), ends);
    first->FlushTiers();
  }
  LaneCacheOptions o = Options();
  o.disk_dir = dir.string();
  o.disk_min_free_bytes = 0;
  {
    FakeBackend b(GetParam());
    auto c = Make(b, o);
    const Ran ran = RunJob(*c, b, 0, Cat(doc, Seq(600, 12)), ends);
    EXPECT_EQ(ran.start.tier, "shared");
    c->FlushTiers();
    EXPECT_GE(c->Stats().disk->writes, 1u);
  }
  redis_->Kill();
  {
    FakeBackend b(GetParam());
    auto c = Make(b, o);
    const Ran ran = RunJob(*c, b, 0, Cat(doc, Seq(700, 12)), ends);
    EXPECT_EQ(ran.start.tier, "disk");
  }
  LaneCacheOptions shared_only = Options();
  FakeBackend b(GetParam());
  auto c = Make(b, shared_only);
  const Ran ran = RunJob(*c, b, 0, Cat(doc, Seq(800, 12)), ends);
  EXPECT_NE(ran.start.miss_reason, "");
  EXPECT_EQ(c->Stats().shared_hits, 0u);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, SharedTierLanes, ::testing::Values(Kind::kDense, Kind::kSlidingWindow, Kind::kHybrid, Kind::kRecurrent));

}  // namespace
}  // namespace skippy::lane_cache

namespace skippy::lane_cache {
namespace {

// The events a router follows: an entry stored (with its tokens, in the tenant's namespace), what
// the lane keeps after the job, entries removed and namespaces cleared.
TEST(CacheEvents, StoredLaneRemovedAndClearedAreReported) {
  FakeBackend b(Kind::kDense);
  auto c = Make(b, LaneCacheOptions{});
  std::vector<CacheEvent> seen;
  c->SetEventSink([&](CacheEvent e) { seen.push_back(std::move(e)); });
  const auto doc = Seq(1, 128);
  RunJob(*c, b, 0, Cat(doc, Seq(500, 12)), {128, 140}, "tenant");
  size_t stored = 0, lanes = 0;
  for (const CacheEvent& e : seen) {
    if (e.kind == CacheEvent::Kind::kStored) {
      ++stored;
      EXPECT_EQ(e.tenant_namespace, "tenant");
      EXPECT_TRUE(e.serves_shorter);
      EXPECT_FALSE(e.tokens.empty());
    }
    if (e.kind == CacheEvent::Kind::kLane) {
      ++lanes;
      EXPECT_EQ(e.lane, 0);
      EXPECT_EQ(e.tokens, Cat(doc, Seq(500, 12)));
    }
  }
  EXPECT_GE(stored, 1u);
  EXPECT_EQ(lanes, 1u);
  seen.clear();
  EXPECT_GE(c->Clear(std::string("tenant")), 1u);
  size_t removed = 0, cleared = 0;
  for (const CacheEvent& e : seen) {
    removed += e.kind == CacheEvent::Kind::kRemoved;
    if (e.kind == CacheEvent::Kind::kCleared) {
      ++cleared;
      EXPECT_EQ(e.tenant_namespace, "tenant");
      EXPECT_FALSE(e.all);
    }
  }
  EXPECT_EQ(removed, stored);
  EXPECT_EQ(cleared, 1u);
}

}  // namespace
}  // namespace skippy::lane_cache
