// Server counters and their Prometheus text rendering (/metrics).
//
// Counters are updated by the HTTP threads (requests by endpoint and status) and by the engine
// thread (cache outcomes, tokens, TTFT); gauges (lanes busy, queue depth, cache sizes) are sampled
// when /metrics is rendered. All members are guarded by one mutex (ABSL_GUARDED_BY); updates are a few integer adds.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "skippy/cache/disk_tier.h"
#include "skippy/cache/shared_tier.h"

namespace skippy::server {

struct Gauges {
  uint32_t lanes_total = 0;
  uint32_t lanes_busy = 0;
  size_t queue_depth = 0;
  size_t cache_entries = 0;
  uint64_t cache_bytes_logical = 0;   // charges of live entries (resident KV + payloads)
  uint64_t cache_bytes_physical = 0;  // payload-store physical bytes + resident charges
  size_t decoded_entries = 0;
  uint64_t decoded_bytes = 0;
  uint64_t cache_evictions = 0;
  std::optional<cache::DiskTierStats> disk;      // with a disk tier
  std::optional<cache::SharedTierStats> shared;  // with a shared tier
  bool loading = true;
};

class Metrics {
 public:
  static constexpr std::array<double, 12> kTtftBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                          0.1,   0.25,   0.5,   1.0,  2.5,   10.0};

  // endpoint: a route of the route table, or "other" (never the raw request path: label values
  // must come from a closed set).
  void CountRequest(const std::string& endpoint, int status);
  void CountHit(bool decoded_result);
  void CountMiss(const std::string& reason);
  void AddPromptTokens(uint64_t matched, uint64_t recomputed);
  void AddGenerated(uint64_t tokens);
  void ObserveTtft(double seconds);
  void CountRejected();  // queue full
  void CountCancelled();

  std::string Render(const Gauges& gauges) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_ ABSL_GUARDED_BY(mu_);
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t decoded_hits_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> misses_ ABSL_GUARDED_BY(mu_);
  uint64_t matched_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t recomputed_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generated_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, kTtftBuckets.size()> ttft_buckets_ ABSL_GUARDED_BY(mu_){};
  uint64_t ttft_count_ ABSL_GUARDED_BY(mu_) = 0;
  double ttft_sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace skippy::server
