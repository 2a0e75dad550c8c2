// LaneCache: the exact-prefix cache on the lanes of one model. The layer between the runtime
// (behind LaneBackend) and the server: it owns what each lane holds between jobs, the cache core
// (radix index, pool caps, decoded results), the payload tier and the family's strategy, and it
// knows nothing of HTTP or JSON. A scheduler calls four hooks per job:
//
//   Begin(lane, namespace, prompt, message_ends)
//        the prompt's batch classes (cache::BatchClasses), the restore (the lane's own last
//        prompt cut back, or a stored entry; an exact repeat may also get its decoded result so
//        nothing is prefilled) and the prefill plan: where every batch ends. The lane must be
//        idle (Finish was called for its last job, or it never had one).
//   AtBoundary(lane, end)       after each prefill batch that ends before the prompt does: the
//                               records planned there (exact-boundary families).
//   RecordsWithin(lane, tokens, pos) / RecordAlso(lane, tokens, pos)
//        while the lane prefills (pos: the tokens in it now), for another job that would wait to
//        restore the lane's first `tokens` tokens: how much of them the lane's records will serve,
//        and then the record itself: an exact-boundary family adds one there (the rest of the
//        prefill is cut again); others already record the prompt end, which serves it.
//   CutBatch(lane, pos, rows)   a batch of the plan cut in two, where both keep their class (a
//                               scheduler bounding the time between decode steps).
//   AfterFirstToken(lane, logits)
//        once the first generated token is out and the lane still holds exactly the prompt: the
//        prompt-end records and the decoded result, off the time to first token. Calls after the
//        first do nothing.
//   Finish(lane, completed, generated)
//        the job is over: the lane keeps its prompt for the next job (its strategy's LaneKeep,
//        when `completed`) or is cleared. With a smallest exact batch of 1 (runtime::OneRowClass:
//        a token decoded alone is computed as a prompt row) a dense or hybrid lane also keeps
//        the generated tokens decoded into it and records them with the prompt as an entry, so a
//        conversation's next turn restores the previous answer too, on any lane (a hybrid lane
//        itself serves only a prompt that extends everything it holds). With idle work on, that
//        record waits so that the export is off the finishing request's response: the scheduler
//        calls RecordExchanges once the response is out, and failing that, the first idle step or
//        the next Begin on any lane (before it restores anything) makes it. Where the scheduler
//        knows what the next turn will hold (NextTurnFn, below) and that differs from the tokens
//        decoded (a reply that tokenizes otherwise when the client sends it back, a chat
//        template's end of turn and next header), idle work prefills the difference: a dense lane
//        is cut back to where the two part, a hybrid lane gets the prompt end's recurrent state
//        back from its entry unless the next turn extends all it holds.
//
// and, between jobs, idle work (options.answer_prefill):
//
//   HasIdleWork() / IdleStep(max_rows)
//        with a smallest exact batch of 2 (a token decoded alone is a class of its own, every
//        batch of 2+ rows one class) the tokens a job generated into its lane carry other bits
//        than the same tokens prefilled as part of the next turn's prompt. Finish keeps them as
//        the lane's answer to prefill; each IdleStep computes up to max_rows of one lane's answer
//        again as prompt rows (a hybrid lane first gets the prompt end's recurrent state back from
//        its entry), so the lane then holds the exchange as a recompute of the next turn would,
//        and records it as an entry once the answer is done. A conversation's next turn then
//        restores the previous answer too, on any lane. Only a scheduler with nothing to run
//        calls IdleStep: it costs a batch's prefill while no request waits. A job that begins on
//        the lane takes what is done; if it is not the exchange's next turn, the answer waits in
//        a queue (the newest kMaxDeferredPerLane per lane). Idle steps take the oldest answer
//        first, wherever it is: a deferred one has its prompt's entry imported into the lane idle
//        longest (one with no answer of its own if there is one) and goes on from there.
//        Where the scheduler knows what the next turn will hold (NextTurnFn, asked in the
//        answer's first idle step: the reply as the client sends it back, which may tokenize
//        otherwise than the tokens generated, and for a chat the template's end of turn and next
//        header), what follows the prompt there is the answer; one whose next turn does not start
//        with the prompt is dropped. Until it is asked, a job whose prompt extends the lane's
//        counts as that turn.
//
// Every batch of every prefill, cache on or off, follows the prompt's batch classes, and a
// restored prefix serves a prompt only as far as its rows were computed in the same classes: a
// token's KV and logits depend in their last bits on the size class of the batch it was prefilled
// in (runtime::MinExactBatch) and on nothing else (proved per model at startup by the batch-split
// check). tests/server compares outputs and log-probabilities with --no-cache per family, flash
// attention on and off.
//
// With options.disk_dir, a disk tier (cache::DiskTier) under the RAM, and with options.shared a
// shared tier (cache::SharedTier, Redis) under that: every entry is written through to both, and a
// prompt RAM serves less of than a tier reads that tier's entry back, so prefixes outlive RAM
// evictions and restarts, and replicas of one model share them (docs/DESIGN.md, "The disk tier",
// "The shared tier").
//
// Recording is best effort (a full cache, an existing entry or a failed export skips it). Namespaces:
// a scope's cache_namespace is the tenant namespace plus clear epochs, so Clear(namespace) makes
// every entry of that namespace, and every lane's memory of it, unreachable at once.
//
// Thread-safety: every method but Stats() runs on the engine thread only (the thread that owns the
// backend). Stats() may be called from any thread.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "skippy/cache/cache.h"
#include "skippy/cache/disk_tier.h"
#include "skippy/cache/shared_tier.h"
#include "skippy/cache/payload_tier.h"
#include "skippy/lane_cache/entry_table.h"
#include "skippy/lane_cache/lane_backend.h"
#include "skippy/lane_cache/options.h"
#include "skippy/lane_cache/prefill_plan.h"
#include "skippy/lane_cache/recorder.h"
#include "skippy/lane_cache/restore.h"
#include "skippy/lane_cache/stats.h"
#include "skippy/lane_cache/strategy.h"

namespace skippy::lane_cache {

// The tokens a conversation's next turn is expected to start with: the prompt, the answer as the
// client sends it back and, for a chat, the template's tokens before the next message
// (runtime::NextTurnPrefix, NextTextPrefix); nullopt when that is not known. Called at most once,
// on the engine thread, in idle time.
using NextTurnFn = std::function<std::optional<std::vector<Token>>()>;

// What Begin tells the scheduler.
struct JobStart {
  size_t restored = 0;  // prompt tokens now in the lane; prefill starts there
  // Set for an exact repeat whose whole prompt was restored: the first token's logits (no prefill).
  std::shared_ptr<const cache::DecodedResult> decoded;
  std::string miss_reason;  // "" on a hit: cache-disabled, short-prompt, never-seen, evicted, ...
  std::string payload;      // "resident-kv" / "kv-recurrent" on a hit
  std::string tier;         // "lane", "memory", "disk" or "shared" on a hit
  std::vector<size_t> chunk_ends;  // where each prefill batch ends, ascending, last == prompt size
};

class LaneCache {
 public:
  // InvalidArgument for a bad configuration identity or options; the disk and shared tiers' errors
  // (a directory in use or not writable, a password Redis refuses) as their Open gives them.
  // `backend` outlives the cache.
  [[nodiscard]] static StatusOr<std::unique_ptr<LaneCache>> Create(const LaneCacheOptions& options,
                                                                   LaneBackend& backend);
  // The caller's injected tier (a disk or shared tier, or a small memory tier in tests).
  [[nodiscard]] static StatusOr<std::unique_ptr<LaneCache>> Create(const LaneCacheOptions& options,
                                                                   LaneBackend& backend,
                                                                   std::unique_ptr<cache::PayloadTier> tier);

  JobStart Begin(int32_t lane, const std::string& tenant_namespace, std::span<const Token> prompt,
                 std::span<const size_t> message_ends);
  void AtBoundary(int32_t lane, size_t end);
  // The lane's new chunk ends (the ones up to pos unchanged) when the record was added; nullopt
  // when nothing changed: not an exact-boundary family, not pos < tokens < the prompt's length,
  // already a record, or too close to a batch end or another planned record to cut there (a
  // record already planned is never given up for this one).
  std::optional<std::vector<size_t>> RecordAlso(int32_t lane, size_t tokens, size_t pos);
  // Cuts the lane's next batch (the one from pos, a batch end or the restored prefix) after about
  // `rows` rows, for a scheduler that has less time than the batch takes: the cut is moved so that
  // both pieces keep a whole batch of their class (cache::BatchClasses), which is what makes it
  // exact. Returns the lane's new chunk ends (the ones up to pos unchanged, one end more); nullopt
  // when the batch cannot be cut that way or already ends within `rows`. Records are unchanged.
  std::optional<std::vector<size_t>> CutBatch(int32_t lane, size_t pos, size_t rows);
  // How much of the first `tokens` tokens of the lane's prompt another job could restore from the
  // records of the lane's prefill in flight (pos: the tokens in it now): `now`, from the records
  // made so far, and `later`, once its first token is out, counting the record that
  // RecordAlso(lane, tokens, pos) would add. Both 0 when the lane records nothing (no job, the
  // cache off, a prompt shorter than MinBatch()).
  struct SharedRecords {
    size_t now = 0;
    size_t later = 0;
  };
  SharedRecords RecordsWithin(int32_t lane, size_t tokens, size_t pos) const;
  void AfterFirstToken(int32_t lane, const std::vector<float>& logits);
  // generated: the tokens decoded into the lane after the prompt, in order (not the last sampled
  // one, which was never decoded). next_turn: where the answer to prefill is known otherwise.
  // Does nothing for a lane whose job never began (no Begin since the last Finish): the lane
  // keeps what it held.
  void Finish(int32_t lane, bool completed, std::span<const Token> generated = {}, NextTurnFn next_turn = {});

  // Records every exchange Finish left unrecorded (see Finish): a scheduler calls it once a
  // finished job's response is out.
  void RecordExchanges();
  // Whether a lane has an answer to prefill or an exchange to record (see above).
  bool HasIdleWork() const;
  // Records one lane's exchange that Finish left to idle work, or prefills one batch of at most
  // max_rows (within [2 * MinBatch(), prefill_chunk]: a longer batch would be split at n_batch,
  // maybe into a row of its own) of one lane's answer and records the exchange when the
  // answer is done, or brings a deferred answer's prompt into a lane. A lane whose batch fails is
  // cleared. Does nothing while a job is between Begin and Finish.
  void IdleStep(size_t max_rows);

  // Drops every entry of one tenant namespace, or of all when nullopt; returns how many prefix
  // entries were erased. Between jobs' steps only (no lane mid-prefill is affected: its records go
  // to the namespace's old epoch and are unreachable).
  size_t Clear(const std::optional<std::string>& tenant_namespace);

  // The long batch class's smallest batch, and rows per prefill batch at most.
  size_t MinBatch() const { return backend_.facts().min_exact_batch; }
  size_t PrefillChunk() const;
  const FamilyStrategy& strategy() const { return *strategy_; }
  LaneCacheStats Stats() const;
  // Where changes to what the cache holds are reported (CacheEvent); none by default.
  void SetEventSink(CacheEventSink sink);
  // Waits until every entry queued for the disk and shared tiers is written (tests, shutdown).
  void FlushTiers();

 private:
  LaneCache(const LaneCacheOptions& options, LaneBackend& backend, std::unique_ptr<cache::Cache> cache,
            std::unique_ptr<cache::PayloadTier> tier, std::unique_ptr<cache::DiskTier> disk,
            std::unique_ptr<cache::SharedTier> shared);
  std::vector<cache::PrefixTier*> Tiers() const;
  cache::PrefixScope Scope(const std::string& tenant_namespace) const;
  // The tenant namespace of a scope's cache_namespace, if no Clear came since (Recorder::TenantOf).
  std::optional<std::string> TenantOf(const std::string& cache_namespace) const;
  // The lane's last job's prompt, kept for the next job (LaneKeep).
  struct Held {
    std::vector<Token> tokens;
    std::string cache_namespace;
    cache::BatchClasses classes;
    // Idle work: the answer's tokens not yet prefilled as prompt rows after `tokens`, and whether
    // the lane still holds them as decoded past `tokens` (a hybrid lane, whose recurrent state
    // cannot be cut back: the prompt end's comes back from its entry first).
    std::vector<Token> answer;
    size_t answer_from = 0;  // where the answer starts in tokens + answer (the prompt's length)
    uint64_t answer_at = 0;  // finishes_ when its job finished (oldest answers go first)
    bool answer_decoded = false;
    // With a smallest exact batch of 1: `tokens` holds the prompt and the answer as decoded (prompt
    // KV, recorded or exchange_unrecorded), and next_turn has not been asked whether the next turn
    // holds them too.
    bool answer_kept = false;
    // `tokens` (prompt and answer as decoded) are to be recorded as an entry before the lane
    // changes (RecordExchange): Finish left it for after the job's response.
    bool exchange_unrecorded = false;
    NextTurnFn next_turn;  // not asked yet: `answer` is the generated tokens, none prefilled
  };
  // An answer whose lane another conversation took before it was prefilled: the prompt's entry (for
  // a kept answer, the exchange's where it serves part of what the next turn holds) is imported
  // into an idle lane for it later.
  struct DeferredAnswer {
    std::string cache_namespace;
    std::vector<Token> prompt;
    std::vector<Token> answer;
    int32_t lane = 0;  // where it was generated
    uint64_t at = 0;   // Held::answer_at
    NextTurnFn next_turn;
    bool kept = false;  // Held::answer_kept: `answer` is the tokens generated, recorded with the prompt
  };
  static constexpr size_t kMaxDeferredPerLane = 4;
  // A Held with idle work left: an answer to prefill or one kept to check.
  static bool Pending(const Held& held) { return !held.answer.empty() || held.answer_kept; }
  // Whether `job` is the exchange's next turn: its prompt holds the lane's tokens and the whole
  // answer, and more (the prompt and more, where the next turn has not been asked yet).
  static bool Continues(const LaneJob& job, const Held& held);
  void Defer(Held&& held, int32_t lane);
  // Asks next_turn (once) for the tokens after `prompt` to prefill as its answer; false when the
  // next turn does not start with the prompt or leaves less than a batch after it.
  bool Predict(std::span<const Token> prompt, std::vector<Token>& answer, NextTurnFn& next_turn) const;
  // For a Held::answer_kept lane: asks the next turn and, where it holds other tokens after the
  // prompt than the lane serves, sets `held` up for PrefillAnswer to compute them (a dense lane cut
  // back to where the two part; a hybrid lane that cannot go on from all it holds rewound to the
  // prompt's entry); false when there is nothing to prefill. A hybrid lane whose prompt entry is
  // gone keeps the exchange as recorded.
  bool KeptAnswerToPrefill(int32_t lane, Held& held);
  // IdleStep's work; answers (held or deferred) still to prefill or check.
  void IdleWork(size_t max_rows);
  size_t PendingAnswers() const;
  // A deferred answer into a lane: its prompt's entry imported (a kept answer's exchange entry,
  // where it holds the start of what the next turn holds after the prompt), the rest to prefill held.
  Status Resume(DeferredAnswer& d);
  LaneHeld Match(const Held& held, const LaneJob& job) const;
  // The job's plan with a record added at `tokens` (RecordAlso), or nullopt.
  std::optional<PrefillPlan> PlanRecordAlso(const LaneJob& job, size_t tokens, size_t pos) const;
  // Records what the lane holds where Finish left it unrecorded (Held::exchange_unrecorded), unless
  // its namespace was cleared since.
  void RecordExchange(int32_t lane);
  // Records `tokens`, which the lane holds, as an exchange's entry (counted in answer_records).
  void RecordExchangeEntry(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> tokens,
                           const cache::BatchClasses& classes);
  // IdleStep on one lane.
  void PrefillAnswer(int32_t lane, size_t max_rows);
  // The entry serving exactly `tokens`, computed in `classes` (unpinned: use it before anything
  // records); NotFound if there is none.
  StatusOr<cache::Match> EntryOf(const std::string& cache_namespace, std::span<const Token> tokens,
                                 const cache::BatchClasses& classes) const;
  // The deferred answer that finished first (end() when none).
  std::deque<DeferredAnswer>::iterator OldestDeferred();
  // Of `next` (what a next turn holds after a prompt), what the tokens `kept` after that prompt (a
  // lane's, or an exchange entry's) serve: any common start where a cut is exact (dense, in the
  // one-row class), else all of `kept` or nothing (a hybrid state serves its own length only).
  size_t KeptServes(std::span<const Token> kept, std::span<const Token> next) const;
  // A failed idle step on the lane: warns, clears the lane and what it held, counts the answer dropped.
  void DropAnswer(int32_t lane, const char* what, const Status& s);
  // A hybrid lane holding `prompt` and decoded answer rows after them: the prompt end's recurrent
  // state from its entry (computed in `classes`), the attention KV cut back to the prompt. NotFound,
  // with the lane untouched, where there is no such entry.
  Status RewindToPrompt(int32_t lane, const std::string& cache_namespace, std::span<const Token> prompt,
                        const cache::BatchClasses& classes);
  // Reports what a lane holds now (CacheEvent::kLane; no tokens: nothing it serves).
  void LaneEvent(int32_t lane, const std::string& cache_namespace, std::span<const Token> tokens);

  const LaneCacheOptions options_;
  LaneBackend& backend_;
  LaneCacheCounters counters_;
  std::unique_ptr<cache::Cache> cache_;
  std::unique_ptr<cache::PayloadTier> tier_;
  std::unique_ptr<cache::DiskTier> disk_;      // both outlive the recorder that writes to them
  std::unique_ptr<cache::SharedTier> shared_;
  EntryTable entries_;
  Recorder recorder_;
  Restorer restorer_;
  std::unique_ptr<FamilyStrategy> strategy_;
  RecordPolicy policy_;
  std::vector<LaneJob> jobs_;  // per lane
  std::vector<Held> held_;     // per lane
  std::deque<DeferredAnswer> deferred_;  // at most kMaxDeferredPerLane per lane
  std::vector<uint64_t> finished_at_;    // per lane: finishes_ when its last job finished
  uint64_t finishes_ = 0;
  uint64_t global_epoch_ = 0;
  std::map<std::string, uint64_t> epochs_;
  CacheEventSink events_;
};

}  // namespace skippy::lane_cache
