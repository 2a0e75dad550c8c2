// ServingCache: the exact-prefix cache on the request path. It composes the cache core (Cache:
// radix index + resident pool + decoded results) with the PayloadStore and the Engine, and is
// used ONLY from the engine thread (it calls llama.cpp through the Engine).
//
// Per request (see Scheduler):
//   0. Classes(n, message_boundaries): the prompt's batch classes (cache::BatchClasses), which
//      every step below follows, cache on or off.
//   1. Restore(lane, scope, prompt, classes): the longest usable prefix in the request's scope --
//      the lane's own last prompt cut back (LaneReuse), or a stored entry: ResidentKv:
//      ImportResident + Truncate (SWA models: the exact length of an entry longer than the
//      window); KvRecurrent: ImportState. An exact repeat whose whole prompt is restorable also
//      returns the decoded-result entry (the last prompt position's logits), so nothing is
//      prefilled. Otherwise the restored prefix ends where a whole batch of its run's class is
//      left to prefill (with one long run: n - MinBatch()), and no further than the rows the lane
//      or entry computed in the same classes. The outcome also says where the prompt branches off
//      the paths the cache and the lane hold.
//   2. Plan(prompt, message_boundaries, classes, restored, branch): the prefill chunk ends and the
//      exact-boundary record boundaries (the branch point among them), every batch within one run
//      and of its class's size. tests/server checks per family that outputs and log-probabilities
//      equal a --no-cache run's.
//   3. RecordRecurrent(lane, scope, prefix) at each planned boundary during prefill (and, for
//      sliding-window models, RecordResident(lane, scope, prefix) there: their entries serve only
//      exact lengths); the prompt-end records (RecordResident, the last boundary, PutDecoded) once
//      the first token is out.
//
// A second ResidentKv tier, resident cache sequences in one shared stream (--kv-unified, capped by
// cache_tokens, spilled to the payload store beyond it), is kept here but refused by skippy-server
// with the cache on: it was not bit-exact (src/skippy/cache/TODO.md).
// Recording is best effort: a full cache, an existing entry or a refused reservation skips the
// record (the request is still served). Every entry the cache core returns as evicted or freed
// has its cache sequence cleared / payload released before its sequence id is reused.
//
// Namespaces: a scope's cache_namespace is the tenant namespace plus a clear-epoch, so
// Clear(namespace) makes every entry of that namespace unreachable at once (resident and payload
// entries are also erased and freed; decoded-result entries age out of their LRU).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/cache/batch_classes.h"
#include "skippy/cache/cache.h"
#include "skippy/cache/payload_store.h"
#include "skippy/runtime/engine.h"
#include "skippy/server/metrics.h"
#include "skippy/server/server_options.h"

namespace skippy::server {

struct RestoreOutcome {
  size_t restored = 0;  // tokens now in the lane (0 on a miss)
  std::shared_ptr<const cache::DecodedResult> decoded;  // set when the whole prompt was restored
  std::string miss_reason;  // "" on a hit
  std::string payload;      // "resident-kv" / "kv-recurrent" on a hit
  // Where the prompt branches off what the cache and the lane have seen (hit or miss; 0 when
  // unknown): Plan records there, so the next prompt that branches at the same point hits it.
  size_t branch = 0;
};

// A KvRecurrent record whose attention KV is still to be copied (ServingCache::DefersRecurrentRecords).
struct PendingRecord {
  size_t tokens = 0;               // the boundary
  std::vector<uint8_t> recurrent;  // the recurrent state there (a PARTIAL_ONLY export)
};

struct PrefillPlan {
  std::vector<size_t> chunk_ends;        // ascending, last == n
  std::vector<size_t> record_boundaries; // KvRecurrent boundaries (subset of chunk_ends)
};

class ServingCache {
 public:
  // `enabled` false (--no-cache): Restore always misses ("cache-disabled") and records are no-ops,
  // but Plan is the same. With the cache on, Create first runs certify::CheckBatchSplits on lane 0
  // and turns the cache off (disabled_reason in StatsJson) when it fails or cannot run.
  [[nodiscard]] static StatusOr<std::unique_ptr<ServingCache>> Create(const ServerOptions& options,
                                                                      runtime::Engine& engine);

  cache::PrefixScope Scope(const std::string& tenant_namespace) const;
  // The batch classes of a prompt (cache::BatchClasses, with MinBatch() as the long class): every
  // prefill of it, cache on or off, follows them, and a restored prefix serves it only as far as
  // its rows were computed in the same classes.
  cache::BatchClasses Classes(size_t n_tokens, std::span<const size_t> message_boundaries) const {
    return cache::BatchClasses::Of(n_tokens, message_boundaries, MinBatch());
  }
  // restored: the prefix already in the lane (Restore's outcome), where the chunks start. The chunks
  // follow `classes` (Classes(prompt.size(), message_boundaries)): no batch mixes classes or is
  // smaller than its class allows (record boundaries that would cut one are dropped); chunk_ends
  // is empty when restored == prompt size.
  // branch: RestoreOutcome::branch (an exact-boundary record candidate right after the full prompt).
  PrefillPlan Plan(std::span<const runtime::Token> prompt, std::span<const size_t> message_boundaries,
                   const cache::BatchClasses& classes, size_t restored, size_t branch = 0) const;

  // lane_tokens: how many of the prompt's first tokens the lane already holds, computed by an
  // earlier prompt's prefill in the same scope (LaneReuse or HybridLaneReuse only; else 0), and
  // lane_prompt_tokens: that earlier prompt's length. LaneReuse: when lane_tokens is at least what
  // the cache offers, the lane is cut to it and nothing is imported. HybridLaneReuse: a KvRecurrent
  // hit within lane_tokens imports only its recurrent state (Engine::RestoreRecurrentOnto). On a
  // miss the lane is cleared. Never leaves the lane half-restored: on any failure the lane is
  // cleared and the outcome is a miss with reason "restore-failed".
  // classes: the prompt's (Classes); lane_classes: the lane's last prompt's. Neither a stored entry
  // nor the lane serves rows past the first one classed differently, and a restore ends only where
  // the rest of its run holds a whole batch (BatchClasses::CanStartAt).
  RestoreOutcome Restore(int32_t lane, const cache::PrefixScope& scope, std::span<const runtime::Token> prompt,
                         const cache::BatchClasses& classes, size_t lane_tokens = 0, size_t lane_prompt_tokens = 0,
                         const cache::BatchClasses* lane_classes = nullptr);
  // Whether a lane may keep its last prompt's KV for the next request (ResidentKv families, one
  // stream per lane, sliding-window layers full-size so no cell of the lane is ever overwritten):
  // cutting it to a shared prefix gives the cells a recompute would put in the same places.
  bool LaneReuse() const;
  // Whether a hybrid lane may keep its last prompt's attention KV (and whatever recurrent state it
  // ended with) for the next request: a KvRecurrent hit at a boundary within the shared prefix then
  // replaces only the recurrent state and cuts the attention KV there, as llama-server restores a
  // context checkpoint, instead of importing the whole state. One stream per lane, full attention.
  bool HybridLaneReuse() const;

  // A token's KV and logits depend in the last bits on the size class of the batch it was prefilled
  // in (runtime::MinExactBatch: with flash attention on 1 / 2-63 / 64+ rows, off 1 / 2+ rows), and
  // within a class on nothing else: not on where the batch starts nor on how long it is
  // (docs/DESIGN.md; proved per model at startup, see Create). MinBatch() is the long class's
  // smallest batch; which rows are long and which short is the prompt's BatchClasses (Classes), so
  // a restored token was computed in a batch of the same class as in a recompute. Prompts shorter
  // than MinBatch() are neither cached nor served from the cache. tests/server compares
  // log-probabilities with --no-cache for this, with flash attention on and off, raw and chat.
  size_t MinBatch() const;
  // Rows per prefill batch at most: --prefill-chunk, at least 2 * MinBatch() (see Plan).
  size_t PrefillChunk() const;
  // Every record takes the classes of the prompt the lane computed (Classes); the entry keeps them.
  void RecordRecurrent(int32_t lane, const cache::PrefixScope& scope, std::span<const runtime::Token> prefix,
                       const cache::BatchClasses& classes);
  // Hybrids whose attention KV is a plain per-lane cache (HybridLaneReuse): a boundary inside the
  // prompt copies only the recurrent state (CopyRecurrentState, on the path to the first token); once
  // the first token is out, RecordDeferred exports the lane once at the prompt end and builds every
  // boundary's payload from that export's attention KV (runtime::HybridStateAt, byte-identical to
  // an export at the boundary). Saves copying the attention KV before the first token.
  bool DefersRecurrentRecords() const { return HybridLaneReuse(); }
  // nullopt (and nothing to record) when the cache is off or the copy fails.
  std::optional<PendingRecord> CopyRecurrentState(int32_t lane, size_t tokens);
  // REQUIRES: the lane holds exactly `prompt`. Records the prompt end when `record_prompt` and each
  // pending boundary (a prefix of `prompt`).
  void RecordDeferred(int32_t lane, const cache::PrefixScope& scope, std::span<const runtime::Token> prompt,
                      const cache::BatchClasses& classes, bool record_prompt, std::span<const PendingRecord> pending);
  void RecordResident(int32_t lane, const cache::PrefixScope& scope, std::span<const runtime::Token> prompt,
                      const cache::BatchClasses& classes);
  void PutDecoded(const cache::PrefixScope& scope, std::span<const runtime::Token> prompt,
                  const cache::BatchClasses& classes, const std::vector<float>& logits);

  // Drops every entry of one tenant namespace, or of all namespaces when nullopt. Returns how many
  // prefix entries were erased.
  size_t Clear(const std::optional<std::string>& tenant_namespace);

  bool enabled() const { return enabled_; }
  bool SlidingWindowResident() const {
    return engine_.family().payload == cache::PayloadKind::kResidentKv && engine_.model().n_swa() > 0;
  }
  // ResidentKv entries of a sliding-window model longer than the window serve only their exact
  // length, so they are recorded at the planned boundaries during prefill (like KvRecurrent: turn
  // boundaries, the tail, the grid on a miss), not only at the end.
  bool ExactBoundaryResident() const { return SlidingWindowResident(); }
  // A sliding-window entry longer than the window keeps only the window of its last tokens in the
  // SWA layers, so it serves its exact length only; one within the window serves shorter prefixes.
  bool SlidingWindowExact(size_t entry_tokens) const {
    return SlidingWindowResident() && entry_tokens > static_cast<size_t>(engine_.model().n_swa());
  }
  nlohmann::json StatsJson() const;
  void FillGauges(Gauges& g) const;

 private:
  ServingCache(const ServerOptions& options, runtime::Engine& engine) : options_(options), engine_(engine) {}
  void Free(const cache::EntryInfo& info, bool release_payload = true);
  // Frees evicted entries; with `spill`, a resident entry's KV moves to the payload store instead.
  void FreeAll(const std::vector<cache::EntryInfo>& infos, bool spill = true);
  void Spill(const cache::EntryInfo& info);
  // Drops the pin a Lookup took; frees the entry if it was erased meanwhile.
  void ReleasePin(cache::EntryId id);
  // Imports a payload-store entry (ResidentKv or KvRecurrent bytes) into `lane`; `tokens`: the
  // prefix it serves (a sliding-window import is padded back to position 0 with their ids).
  Status ImportStored(const cache::EntryDesc& desc, int32_t lane, std::span<const runtime::Token> tokens);
  // HybridLaneReuse: reads only the recurrent part of a stored KvRecurrent entry and restores it onto
  // the lane's attention KV (Engine::RestoreRecurrentOnto).
  Status RestoreRecurrentOnto(const cache::EntryInfo& entry, int32_t lane, size_t n_tokens);
  // Records exported bytes as a payload-store entry (no cache sequence). False if not recorded.
  bool StorePayload(const cache::PrefixScope& scope, std::span<const runtime::Token> tokens, cache::PayloadKind kind,
                    const std::vector<uint8_t>& bytes, double recompute_cost, bool exact_only,
                    const cache::BatchClasses& classes);
  // How many of the prompt's first rows an entry may serve: up to its first row classed otherwise.
  size_t AgreedRows(cache::EntryId id, const cache::BatchClasses& classes) const;
  // Decoded results are kept per classing: the last row's logits differ with its batch class.
  cache::PrefixScope DecodedScope(const cache::PrefixScope& scope, const cache::BatchClasses& classes) const;
  // Erases the entries whose payloads the store evicted for its own cap.
  void DropStoreEvictions(const std::vector<uint64_t>& evicted);
  void Forget(cache::EntryId id);
  // A sliding-window import longer than the window pins the lane to at least its length; lane reuse
  // is preferred unless the entry saves this many more tokens.
  static constexpr size_t kPaddedImportMinSaving = 64;

  ServerOptions options_;
  runtime::Engine& engine_;
  bool enabled_ = true;
  std::string disabled_reason_;  // why the cache is off although it was asked for ("" otherwise)
  nlohmann::json batch_split_;   // the startup check's report (null when it did not run)
  cache::CacheConfigIdentity config_;
  std::unique_ptr<cache::Cache> cache_;
  std::unique_ptr<cache::PayloadStore> store_;
  uint64_t resident_bytes_per_token_ = 1;
  uint64_t global_epoch_ = 0;
  std::map<std::string, uint64_t> epochs_;
  struct Registered {
    std::string tenant_namespace;
    uint64_t payload_id = 0;
    cache::PrefixScope scope;         // resident entries only: what a spill re-records
    std::vector<runtime::Token> tokens;
    // Hybrid KvRecurrent payloads: where the recurrent state starts (HybridRecurrentOffset), so a
    // HybridLaneReuse restore reads only that part; 0 when unknown.
    size_t recurrent_offset = 0;
    cache::BatchClasses classes;  // the batch classes its rows were computed in
  };
  std::map<cache::EntryId, Registered> entries_;
  std::map<uint64_t, cache::EntryId> by_payload_;
  // Read by HTTP threads for /metrics and /cache/stats.
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> records_{0};
  std::atomic<uint64_t> record_skips_{0};
  std::atomic<uint64_t> spills_{0};
  std::atomic<uint64_t> stored_hits_{0};
  std::atomic<uint64_t> lane_hits_{0};
  std::atomic<uint64_t> recurrent_onto_hits_{0};  // HybridLaneReuse restores
};

}  // namespace skippy::server
