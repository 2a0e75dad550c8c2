// Recorder: turns what a lane holds into cache entries, and gives entries back. An entry is a
// payload in the tier (exported through the backend), an entry in the cache core (radix index +
// caps) and a row in the EntryTable, made or dropped together.
//
// With tiers keyed by prefix below RAM (disk, shared), every entry recorded is also queued for
// each of them (write-through: it is there when RAM evicts it, after a restart, and for the other
// replicas), under its tenant namespace, unless a Clear of that namespace came after the job
// began. An entry read back from one tier (Adopt) is written to the others only.
//
// Recording is best effort: a full cache, an existing entry or a failed export skips the record
// (counted as record_skips; the request is still served). Entries the cache core evicts for its
// caps, and entries whose payload the tier evicts for its own (through the on_evict callback of
// PayloadTier::Put), are dropped from all three before the call returns.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "skippy/cache/batch_classes.h"
#include "skippy/cache/cache.h"
#include "skippy/cache/prefix_tier.h"
#include "skippy/cache/payload_tier.h"
#include "skippy/lane_cache/entry_table.h"
#include "skippy/lane_cache/events.h"
#include "skippy/lane_cache/lane_backend.h"
#include "skippy/lane_cache/stats.h"

namespace skippy::lane_cache {

// A hybrid record whose attention KV is still to be copied (Recorder::CopyRecurrent).
struct PendingRecord {
  size_t tokens = 0;               // the boundary
  std::vector<uint8_t> recurrent;  // the recurrent state there (a kRecurrentOnly export)
};

// Decoded results are kept per classing: the last row's logits differ with its batch class. Two
// (scope, classes) pairs that differ give two different scopes.
cache::PrefixScope DecodedScope(const cache::PrefixScope& scope, const cache::BatchClasses& classes);

class Recorder {
 public:
  // A scope's cache_namespace -> its tenant namespace, if the scope is still current (no Clear
  // since); nullopt otherwise.
  using TenantOf = std::function<std::optional<std::string>(const std::string& cache_namespace)>;

  Recorder(LaneBackend& backend, cache::Cache& cache, cache::PayloadTier& tier, EntryTable& entries,
           LaneCacheCounters& counters, std::vector<cache::PrefixTier*> tiers = {}, TenantOf tenant_of = nullptr)
      : backend_(backend),
        cache_(cache),
        tier_(tier),
        entries_(entries),
        counters_(counters),
        tiers_(std::move(tiers)),
        tenant_of_(std::move(tenant_of)) {}

  // ResidentKv: exports the lane's KV as the entry of `prompt`. Skipped unless the lane holds
  // exactly prompt.size() tokens. exact_only: the entry serves its whole length only (sliding
  // window shorter than the prompt). Returns whether the entry was recorded.
  bool Resident(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prompt,
                const cache::BatchClasses& classes, bool exact_only);
  // KvRecurrent: exports the lane's whole state, which ends at the end of `prefix`. Returns
  // whether the entry was recorded.
  bool Recurrent(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prefix,
                 const cache::BatchClasses& classes);
  // Hybrids: copies only the recurrent state of a lane holding `tokens` tokens, for Deferred.
  // nullopt (counted as a skip) when the export fails.
  std::optional<PendingRecord> CopyRecurrent(int32_t lane, size_t tokens);
  // Hybrids. REQUIRES: the lane holds exactly `prompt`. Exports the lane once and records the
  // prompt end (when `record_prompt`) and every pending boundary, each boundary's payload built
  // from that export's attention KV and the recurrent state copied there (LaneBackend::StateAt).
  void Deferred(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prompt,
                const cache::BatchClasses& classes, bool record_prompt, std::span<const PendingRecord> pending);
  // The last prompt position's logits, for an exact repeat of the whole prompt.
  void Decoded(const cache::PrefixScope& scope, std::span<const Token> prompt, const cache::BatchClasses& classes,
               const std::vector<float>& logits);

  // An entry read back from tier `from` becomes a RAM entry again (and is queued for the other
  // tiers); its id, or nullopt when the cache core has no room or the entry is already in RAM.
  std::optional<cache::EntryId> Adopt(const cache::PrefixScope& scope, const cache::PrefixRecord& record,
                                      std::span<const uint8_t> bytes, const cache::PrefixTier* from);
  // The tiers below RAM, nearest first (disk, then shared), and the tenant namespace `scope` is
  // kept under there (nullopt when a Clear came since the scope was made).
  const std::vector<cache::PrefixTier*>& tiers() const { return tiers_; }
  std::optional<std::string> TierNamespace(const cache::PrefixScope& scope) const;

  // Where entries stored and removed are reported (none by default).
  void SetEventSink(CacheEventSink sink) { events_ = std::move(sink); }
  // The tenant namespace of a scope, if no Clear came since it was made.
  std::optional<std::string> TenantNamespace(const cache::PrefixScope& scope) const;

  // Drops the pin a Lookup took; frees the entry if it was erased meanwhile.
  void Release(cache::EntryId id);
  // Erases an entry (deferred by the cache core while pinned); returns whether it existed.
  bool Erase(cache::EntryId id);
  // An entry the cache core no longer tracks: its payload goes back to the tier, its row away.
  void Free(const cache::EntryInfo& info);

 private:
  // Stores `bytes` as the entry of `tokens` and queues it for every tier below RAM but `from`;
  // its id, nullopt if not recorded.
  std::optional<cache::EntryId> Store(const cache::PrefixScope& scope, std::span<const Token> tokens,
                                      cache::PayloadKind kind, std::span<const uint8_t> bytes, bool exact_only,
                                      const cache::BatchClasses& classes, const cache::PrefixTier* from = nullptr);
  void Count(bool recorded);
  // PayloadTier::OnEvict: the tier dropped `payload` for its cap.
  void PayloadEvicted(cache::PayloadId payload);

  LaneBackend& backend_;
  cache::Cache& cache_;
  cache::PayloadTier& tier_;
  EntryTable& entries_;
  LaneCacheCounters& counters_;
  const std::vector<cache::PrefixTier*> tiers_;
  const TenantOf tenant_of_;
  CacheEventSink events_;
};

}  // namespace skippy::lane_cache
