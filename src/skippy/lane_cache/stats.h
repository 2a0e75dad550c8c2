// LaneCacheStats: what the cache on the lanes reports (skippy-server renders it as /cache/stats
// and Prometheus gauges). Counters are cumulative since startup.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "skippy/cache/cache.h"
#include "skippy/cache/disk_tier.h"
#include "skippy/cache/payload_tier.h"
#include "skippy/cache/shared_tier.h"

namespace skippy::lane_cache {

// Written on the engine thread, read from any thread.
struct LaneCacheCounters {
  std::atomic<uint64_t> records{0};             // entries recorded
  std::atomic<uint64_t> answer_records{0};      // of those, a prompt with the answer generated to it
  std::atomic<uint64_t> answer_prefill_tokens{0};  // answer tokens prefilled as prompt rows between jobs
  std::atomic<uint64_t> answers_dropped{0};     // answers never prefilled: the deferred queue was full, a
                                                // Clear came, the prompt's entry was gone, a batch failed,
                                                // the next turn worked out would not start with the prompt
  std::atomic<uint64_t> answers_pending{0};     // now, not cumulative: answers idle work has yet to
                                                // prefill or check against their next turn, and
                                                // lanes whose exchange is yet to be recorded
  std::atomic<uint64_t> record_skips{0};        // records not made (full, present, failed export)
  std::atomic<uint64_t> evictions{0};           // entries dropped for a cap
  std::atomic<uint64_t> stored_hits{0};         // restores imported from the payload tier
  std::atomic<uint64_t> lane_hits{0};           // restores that cut the lane's own last prompt
  std::atomic<uint64_t> recurrent_onto_hits{0}; // hybrid restores of the recurrent state only
  std::atomic<uint64_t> disk_hits{0};           // disk entries read back into RAM for a restore
  std::atomic<uint64_t> shared_hits{0};         // shared-tier entries read back into RAM for a restore
};

struct LaneCacheStats {
  bool enabled = false;
  std::string disabled_reason;
  std::string strategy;  // FamilyStrategy::name()
  cache::CacheStats cache;  // index, pool caps, decoded results
  std::string tier_name;
  cache::TierUsage tier;
  uint64_t records = 0, answer_records = 0, record_skips = 0, evictions = 0;
  uint64_t answer_prefill_tokens = 0, answers_dropped = 0, answers_pending = 0;
  uint64_t stored_hits = 0, lane_hits = 0, recurrent_onto_hits = 0, disk_hits = 0, shared_hits = 0;
  std::optional<cache::DiskTierStats> disk;      // with a disk tier
  std::optional<cache::SharedTierStats> shared;  // with a shared tier
};

}  // namespace skippy::lane_cache
