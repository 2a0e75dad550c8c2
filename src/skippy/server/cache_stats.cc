#include "skippy/server/cache_stats.h"

namespace skippy::server {
namespace {

nlohmann::json SharedJson(const cache::SharedTierStats& t) {
  return {{"endpoint", t.endpoint},
          {"connected", t.connected},
          {"entries", t.entries},
          {"loaded_at_open", t.loaded_at_open},
          {"hits", t.hits},
          {"misses_by_reason",
           {{"never-seen", t.misses_never_seen}, {"evicted", t.misses_evicted}, {"gone", t.misses_gone},
            {"unavailable", t.unavailable}}},
          {"corrupt", t.corrupt},
          {"foreign", t.foreign},
          {"writes", t.writes},
          {"write_skips", t.write_skips},
          {"write_drops", t.write_drops},
          {"write_errors", t.write_errors},
          {"blocks_written", t.blocks_written},
          {"blocks_deduplicated", t.blocks_deduplicated},
          {"events", t.events},
          {"resyncs", t.resyncs},
          {"queued_bytes", t.queued_bytes},
          {"read_ms", t.read_ms},
          {"write_ms", t.write_ms}};
}

nlohmann::json DiskJson(const cache::DiskTierStats& d) {
  return {{"dir", d.dir},
          {"entries", d.entries},
          {"bytes", d.bytes},
          {"capacity_bytes", d.capacity_bytes},
          {"foreign_entries", d.foreign_entries},
          {"foreign_bytes", d.foreign_bytes},
          {"loaded_at_open", d.loaded_at_open},
          {"hits", d.hits},
          {"misses_by_reason", {{"never-seen", d.misses_never_seen}, {"evicted", d.misses_evicted}, {"gone", d.misses_gone}}},
          {"corrupt", d.corrupt},
          {"read_errors", d.read_errors},
          {"writes", d.writes},
          {"write_skips", d.write_skips},
          {"write_drops", d.write_drops},
          {"write_errors", d.write_errors},
          {"no_space", d.no_space},
          {"evictions", d.evictions},
          {"queued_bytes", d.queued_bytes},
          {"read_ms", d.read_ms},
          {"write_ms", d.write_ms}};
}

}  // namespace

nlohmann::json CacheStatsJson(const lane_cache::LaneCacheStats& s) {
  const cache::RadixStats& index = s.cache.pool.index;
  const cache::DecodedResultStats& d = s.cache.decoded;
  const uint64_t saved = s.tier.logical_bytes > s.tier.physical_bytes ? s.tier.logical_bytes - s.tier.physical_bytes : 0;
  return {
      {"enabled", s.enabled},
      {"disabled_reason", s.disabled_reason},
      {"strategy", s.strategy},
      {"entries", index.entries},
      {"tokens", index.tokens},
      {"bytes_logical", index.bytes},
      {"hits", index.hits},
      {"misses", index.misses},
      {"misses_by_reason",
       {{"never-seen", index.miss_never_seen},
        {"evicted", index.miss_evicted},
        {"identity-mismatch", index.miss_identity_mismatch}}},
      {"evictions", s.evictions},
      {"records", s.records},
      {"answer_records", s.answer_records},
      {"answer_prefill_tokens", s.answer_prefill_tokens},
      {"answers_dropped", s.answers_dropped},
      {"answers_pending", s.answers_pending},
      {"record_skips", s.record_skips},
      {"stored_hits", s.stored_hits},
      {"lane_hits", s.lane_hits},
      {"recurrent_onto_hits", s.recurrent_onto_hits},
      {"disk_hits", s.disk_hits},
      {"disk", s.disk ? DiskJson(*s.disk) : nlohmann::json(nullptr)},
      {"shared_hits", s.shared_hits},
      {"shared", s.shared ? SharedJson(*s.shared) : nlohmann::json(nullptr)},
      {"payload_store",
       {{"tier", s.tier_name}, {"payloads", s.tier.payloads}, {"logical_bytes", s.tier.logical_bytes},
        {"physical_bytes", s.tier.physical_bytes}, {"saved_bytes", saved}, {"capacity_bytes", s.tier.capacity_bytes},
        {"evictions", s.tier.evictions}}},
      {"decoded_results",
       {{"entries", d.entries}, {"bytes", d.bytes}, {"hits", d.hits}, {"misses", d.misses}, {"evictions", d.evictions},
        {"capacity_entries", d.capacity_entries}, {"capacity_bytes", d.capacity_bytes}}},
      // Every kind of cached data held in memory, each beside its cap (the disk and shared tiers
      // are not memory and keep their own caps above).
      {"memory",
       {{"payload_bytes", s.tier.physical_bytes},
        {"payload_capacity_bytes", s.tier.capacity_bytes},
        {"decoded_bytes", d.bytes},
        {"decoded_capacity_bytes", d.capacity_bytes},
        {"bytes", s.tier.physical_bytes + d.bytes},
        {"capacity_bytes", s.tier.capacity_bytes + d.capacity_bytes}}},
  };
}

void FillCacheGauges(const lane_cache::LaneCacheStats& s, Gauges& g) {
  g.cache_entries = s.cache.pool.index.entries;
  g.cache_bytes_logical = s.cache.pool.index.bytes;
  g.cache_bytes_physical = s.tier.physical_bytes;
  g.decoded_entries = s.cache.decoded.entries;
  g.decoded_bytes = s.cache.decoded.bytes;
  g.cache_evictions = s.evictions;
  g.disk = s.disk;
  g.shared = s.shared;
}

}  // namespace skippy::server
