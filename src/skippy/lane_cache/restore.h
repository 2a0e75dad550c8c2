// Restorer: the longest usable prefix of a job's prompt, brought into its lane -- the lane's own
// last prompt cut back, or a stored entry imported -- such that every restored row was computed in
// the same batch class as a recompute computes it (cache::BatchClasses), and at least one batch of
// the last run's class is left to prefill (unless an exact repeat is answered from its decoded
// result). Never leaves a lane half-restored: on any failure the lane is cleared and the outcome
// is a miss with reason "restore-failed".
//
// With tiers below RAM (disk, shared), a prompt that RAM and the lane serve less of than such a
// tier's entry does has that entry read (verified), made a RAM entry again (Recorder::Adopt) and
// restored like any other: the longest one, the nearer tier on a tie, the next one if a read fails.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "skippy/cache/cache.h"
#include "skippy/cache/payload_tier.h"
#include "skippy/lane_cache/entry_table.h"
#include "skippy/lane_cache/lane_backend.h"
#include "skippy/lane_cache/recorder.h"
#include "skippy/lane_cache/stats.h"
#include "skippy/lane_cache/strategy.h"

namespace skippy::lane_cache {

struct RestoreOutcome {
  size_t restored = 0;  // tokens now in the lane (0 on a miss)
  std::shared_ptr<const cache::DecodedResult> decoded;  // set when the whole prompt was restored
  std::string miss_reason;  // "" on a hit
  std::string payload;      // "resident-kv" / "kv-recurrent" on a hit
  std::string tier;         // where the hit came from: "lane", "memory", "disk" or "shared" ("" on a miss)
  // Where the prompt branches off what the cache and the lane have seen (hit or miss; 0 when
  // unknown): the plan records there, so the next prompt that branches at the same point hits it.
  size_t branch = 0;
};

// What a lane holds from its last job in the same namespace (all zero when nothing).
struct LaneHeld {
  size_t shared_tokens = 0;  // the prompt's first tokens equal to the held ones
  size_t prompt_tokens = 0;  // the held prompt's length
  const cache::BatchClasses* classes = nullptr;  // the classes the held tokens were computed in
};

class Restorer {
 public:
  Restorer(LaneBackend& backend, cache::Cache& cache, cache::PayloadTier& tier, const EntryTable& entries,
           Recorder& recorder, LaneCacheCounters& counters)
      : backend_(backend), cache_(cache), tier_(tier), entries_(entries), recorder_(recorder), counters_(counters) {}

  RestoreOutcome Restore(FamilyStrategy& strategy, int32_t lane, const LaneJob& job, const LaneHeld& held);

  // Imports a stored entry's bytes (ResidentKv or KvRecurrent) into `lane`; `tokens`: the prefix
  // it serves (a sliding-window import is padded back to position 0 with their ids).
  Status ImportStored(const cache::EntryDesc& desc, int32_t lane, std::span<const Token> tokens);
  // Hybrids: reads only the recurrent part of a stored KvRecurrent entry and restores it onto the
  // lane's attention KV (LaneBackend::RestoreRecurrentOnto).
  Status RestoreRecurrentOnto(const cache::EntryInfo& entry, int32_t lane, size_t n_tokens);

 private:
  struct Attempt;
  // The entry to restore from, pinned (nullopt: none usable); false if a lookup failed.
  bool FindEntry(FamilyStrategy& strategy, const LaneJob& job, bool decoded, Attempt& a);
  RestoreOutcome Miss(int32_t lane, std::string reason, size_t branch);
  // Reads the tier entry serving more of `key` than `have` tokens (what the lane or RAM give), if
  // any, back into RAM; the new RAM entry's id and the tier's name.
  struct Promoted {
    cache::EntryId id = 0;
    std::string_view tier;
  };
  std::optional<Promoted> PromoteFromTiers(const LaneJob& job, std::span<const Token> key, size_t have);
  // How many of the prompt's first rows an entry may serve: up to its first row classed otherwise.
  size_t AgreedRows(cache::EntryId id, const cache::BatchClasses& classes) const;

  LaneBackend& backend_;
  cache::Cache& cache_;
  cache::PayloadTier& tier_;
  const EntryTable& entries_;
  Recorder& recorder_;
  LaneCacheCounters& counters_;
  std::vector<uint8_t> tier_buffer_;  // tier reads land here (kept: its pages are most of a read's cost)
};

}  // namespace skippy::lane_cache
