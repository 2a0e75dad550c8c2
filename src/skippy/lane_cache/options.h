// LaneCacheOptions: how the cache on a lane is configured (skippy-server fills it from its flags).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "skippy/cache/disk_tier.h"
#include "skippy/cache/shared_tier.h"

namespace skippy::lane_cache {

struct LaneCacheOptions {
  // False: every job misses with "cache-disabled" and nothing is recorded; prefill is planned and
  // cut exactly as with the cache on and the same cut_cost_rows (a --no-cache server computes the
  // same numbers; skippy-server measures no cut cost then, so it may cut long-class batches in
  // other places, which the cache-on server's startup batch-split check proves changes no bit).
  bool enabled = true;
  // Why the cache does not serve although it was asked for (an uncertified family, a failed startup
  // batch-split check); "" otherwise.
  std::string disabled_reason;

  // Exact-boundary records (KvRecurrent, sliding-window ResidentKv): a grid every record_stride
  // tokens, at most max_records per prompt, and one record_tail tokens before the prompt end
  // (0: none).
  uint32_t record_stride = 64;
  uint32_t max_records = 10;
  uint32_t record_tail = 4;
  // What one more prefill batch costs in prompt rows (lane_cache::MeasureCutCost at startup; 0:
  // nothing), and the share of a prefill the grid records' extra batches may cost (0: no budget;
  // RecordPolicy::grid_budget).
  double cut_cost_rows = 0;
  double grid_budget = 0;
  // Rows per prefill batch at most (raised to 2 * the long class's smallest batch). At most the
  // engine's n_batch, which would cut a longer batch again (maybe leaving one row alone).
  uint32_t prefill_chunk = 512;
  // A finished job's generated tokens are kept as its lane's answer to prefill as prompt rows
  // between jobs (LaneCache::IdleStep; only with a smallest exact batch of 2). skippy-server turns
  // it on unless --answer-prefill-idle-ms is negative.
  bool answer_prefill = false;

  // Caps of the prefix entries (bytes: ResidentKv charge + KvRecurrent payloads) and of the
  // decoded results (exact repeats).
  uint32_t max_entries = 256;
  uint64_t max_bytes = uint64_t{1} << 30;
  uint32_t decoded_entries = 1024;
  uint64_t decoded_bytes = uint64_t{256} << 20;

  // The disk tier (cache::DiskTier): entries are written through to this directory and read back
  // after a RAM miss or a restart. "" for none; not opened while the cache is off.
  std::string disk_dir;
  // disk_dir's lock where the caller took it first (cache::CacheDirLock); null: Create takes it.
  std::shared_ptr<const cache::CacheDirLock> disk_lock;
  uint64_t disk_bytes = uint64_t{8} << 30;
  uint64_t disk_min_free_bytes = uint64_t{256} << 20;

  // The shared tier (cache::SharedTier on Redis): entries are written through to it and read
  // back when neither RAM nor the disk serve as much, so replicas of one model share prefixes.
  // nullopt for none; not opened while the cache is off.
  std::optional<cache::SharedTierOptions> shared;
};

}  // namespace skippy::lane_cache
