#include "skippy/server/metrics.h"

#include <span>

#include "skippy/common/strings.h"

namespace skippy::server {

namespace {

// A label value in the Prometheus text exposition format: backslash, double quote and newline
// escaped. The values are from closed sets anyway (routes, status codes, miss reasons).
std::string LabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// One row of a table-driven group of metrics: a sample, with its HELP and TYPE lines when `type`
// is not empty (the first sample of a family).
struct Sample {
  const char* name;
  const char* type;
  const char* help;
  const char* label;  // "" or key="value"
  double value;
};

void AppendSamples(std::string& o, std::span<const Sample> samples) {
  for (const Sample& m : samples) {
    if (*m.type) StrAppend(&o, "# HELP ", m.name, " ", m.help, "\n# TYPE ", m.name, " ", m.type, "\n");
    StrAppend(&o, m.name, *m.label ? StrCat("{", m.label, "}") : std::string(), " ", m.value, "\n");
  }
}

}  // namespace

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}
void Metrics::CountHit(bool decoded_result) {
  std::lock_guard lock(mu_);
  ++hits_;
  if (decoded_result) ++decoded_hits_;
}
void Metrics::CountMiss(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++misses_[reason];
}
void Metrics::AddPromptTokens(uint64_t matched, uint64_t recomputed) {
  std::lock_guard lock(mu_);
  matched_tokens_ += matched;
  recomputed_tokens_ += recomputed;
}
void Metrics::AddGenerated(uint64_t tokens) {
  std::lock_guard lock(mu_);
  generated_tokens_ += tokens;
}
void Metrics::ObserveTtft(double seconds) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < kTtftBuckets.size(); ++i) {
    if (seconds <= kTtftBuckets[i]) ++ttft_buckets_[i];
  }
  ++ttft_count_;
  ttft_sum_ += seconds;
}
void Metrics::CountRejected() {
  std::lock_guard lock(mu_);
  ++rejected_;
}
void Metrics::CountCancelled() {
  std::lock_guard lock(mu_);
  ++cancelled_;
}

std::string Metrics::Render(const Gauges& g) const {
  std::lock_guard lock(mu_);
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    StrAppend(&o, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  head("skippy_requests_total", "counter", "HTTP requests by endpoint and status.");
  for (const auto& [k, v] : requests_) {
    StrAppend(&o, "skippy_requests_total{endpoint=\"", LabelValue(k.first), "\",status=\"", k.second, "\"} ", v, "\n");
  }
  head("skippy_cache_hits_total", "counter", "Generation requests that restored a cached prefix.");
  StrAppend(&o, "skippy_cache_hits_total ", hits_, "\n");
  head("skippy_cache_decoded_result_hits_total", "counter", "Exact repeats answered from stored last logits.");
  StrAppend(&o, "skippy_cache_decoded_result_hits_total ", decoded_hits_, "\n");
  head("skippy_cache_misses_total", "counter", "Generation requests without a usable prefix, by reason.");
  for (const char* reason : {"never-seen", "evicted", "identity-mismatch", "swa-shorter-prefix", "restore-failed",
                             "cache-disabled"}) {
    auto it = misses_.find(reason);
    StrAppend(&o, "skippy_cache_misses_total{reason=\"", LabelValue(reason), "\"} ",
              it == misses_.end() ? 0 : it->second, "\n");
  }
  head("skippy_prompt_tokens_matched_total", "counter", "Prompt tokens served from the cache.");
  StrAppend(&o, "skippy_prompt_tokens_matched_total ", matched_tokens_, "\n");
  head("skippy_prompt_tokens_recomputed_total", "counter", "Prompt tokens prefilled.");
  StrAppend(&o, "skippy_prompt_tokens_recomputed_total ", recomputed_tokens_, "\n");
  head("skippy_generated_tokens_total", "counter", "Tokens generated.");
  StrAppend(&o, "skippy_generated_tokens_total ", generated_tokens_, "\n");
  head("skippy_requests_rejected_total", "counter", "Requests refused because lanes and queue were full.");
  StrAppend(&o, "skippy_requests_rejected_total ", rejected_, "\n");
  head("skippy_requests_cancelled_total", "counter", "Requests whose client went away before the end.");
  StrAppend(&o, "skippy_requests_cancelled_total ", cancelled_, "\n");
  head("skippy_cache_entries", "gauge", "Live prefix entries (ResidentKv and KvRecurrent).");
  StrAppend(&o, "skippy_cache_entries ", g.cache_entries, "\n");
  head("skippy_cache_bytes", "gauge", "Bytes held by prefix entries: logical charge and physical.");
  StrAppend(&o, "skippy_cache_bytes{kind=\"logical\"} ", g.cache_bytes_logical, "\n");
  StrAppend(&o, "skippy_cache_bytes{kind=\"physical\"} ", g.cache_bytes_physical, "\n");
  head("skippy_cache_decoded_entries", "gauge", "Decoded-result (exact repeat) entries.");
  StrAppend(&o, "skippy_cache_decoded_entries ", g.decoded_entries, "\n");
  head("skippy_cache_decoded_bytes", "gauge", "Bytes held by decoded-result entries.");
  StrAppend(&o, "skippy_cache_decoded_bytes ", g.decoded_bytes, "\n");
  head("skippy_cache_evictions_total", "counter", "Prefix entries evicted to make room.");
  StrAppend(&o, "skippy_cache_evictions_total ", g.cache_evictions, "\n");
  if (g.disk) {
    const cache::DiskTierStats& d = *g.disk;
    const Sample samples[] = {
        {"skippy_disk_entries", "gauge", "Disk tier entries this configuration may serve.", "", double(d.entries)},
        {"skippy_disk_bytes", "gauge", "Bytes of the disk tier's entry files (every configuration's).", "", double(d.bytes)},
        {"skippy_disk_capacity_bytes", "gauge", "The disk tier's byte cap.", "", double(d.capacity_bytes)},
        {"skippy_disk_foreign_entries", "gauge", "Disk entries of another configuration: kept, never served.", "",
         double(d.foreign_entries)},
        {"skippy_disk_hits_total", "counter", "Disk entries read back and verified.", "", double(d.hits)},
        {"skippy_disk_misses_total", "counter", "Disk lookups without a usable entry, by reason.",
         "reason=\"never-seen\"", double(d.misses_never_seen)},
        {"skippy_disk_misses_total", "", "", "reason=\"evicted\"", double(d.misses_evicted)},
        {"skippy_disk_misses_total", "", "", "reason=\"gone\"", double(d.misses_gone)},
        {"skippy_disk_corrupt_total", "counter", "Disk entries removed because a check failed.", "", double(d.corrupt)},
        {"skippy_disk_writes_total", "counter", "Disk entries written, by outcome.", "outcome=\"written\"",
         double(d.writes)},
        {"skippy_disk_writes_total", "", "", "outcome=\"skipped\"", double(d.write_skips)},
        {"skippy_disk_writes_total", "", "", "outcome=\"dropped\"", double(d.write_drops)},
        {"skippy_disk_writes_total", "", "", "outcome=\"error\"", double(d.write_errors)},
        {"skippy_disk_writes_total", "", "", "outcome=\"no-space\"", double(d.no_space)},
        {"skippy_disk_evictions_total", "counter", "Disk entries removed for the byte cap.", "", double(d.evictions)},
        {"skippy_disk_read_seconds_total", "counter", "Time spent reading and verifying disk entries.", "",
         d.read_ms / 1000.0},
        {"skippy_disk_write_seconds_total", "counter", "Time spent writing disk entries.", "", d.write_ms / 1000.0},
    };
    AppendSamples(o, samples);
  }
  if (g.shared) {
    const cache::SharedTierStats& t = *g.shared;
    const Sample samples[] = {
        {"skippy_shared_connected", "gauge", "1 while the shared tier's Redis connection is up.", "",
         t.connected ? 1.0 : 0.0},
        {"skippy_shared_entries", "gauge", "Shared-tier entries this configuration may serve (the mirror).", "",
         double(t.entries)},
        {"skippy_shared_hits_total", "counter", "Shared-tier entries fetched and verified.", "", double(t.hits)},
        {"skippy_shared_misses_total", "counter", "Shared-tier lookups and reads without a usable entry, by reason.",
         "reason=\"never-seen\"", double(t.misses_never_seen)},
        {"skippy_shared_misses_total", "", "", "reason=\"evicted\"", double(t.misses_evicted)},
        {"skippy_shared_misses_total", "", "", "reason=\"gone\"", double(t.misses_gone)},
        {"skippy_shared_misses_total", "", "", "reason=\"unavailable\"", double(t.unavailable)},
        {"skippy_shared_corrupt_total", "counter", "Shared-tier entries removed because a check failed.", "",
         double(t.corrupt)},
        {"skippy_shared_foreign_total", "counter", "Manifests under this configuration's keys naming another.", "",
         double(t.foreign)},
        {"skippy_shared_writes_total", "counter", "Shared-tier entries stored, by outcome.", "outcome=\"written\"",
         double(t.writes)},
        {"skippy_shared_writes_total", "", "", "outcome=\"skipped\"", double(t.write_skips)},
        {"skippy_shared_writes_total", "", "", "outcome=\"dropped\"", double(t.write_drops)},
        {"skippy_shared_writes_total", "", "", "outcome=\"error\"", double(t.write_errors)},
        {"skippy_shared_blocks_total", "counter", "Payload blocks by what a write did with them.",
         "outcome=\"sent\"", double(t.blocks_written)},
        {"skippy_shared_blocks_total", "", "", "outcome=\"deduplicated\"", double(t.blocks_deduplicated)},
        {"skippy_shared_events_total", "counter", "Events received from the other replicas.", "", double(t.events)},
        {"skippy_shared_resyncs_total", "counter", "Mirror rebuilds from Redis (start, every reconnect).", "",
         double(t.resyncs)},
        {"skippy_shared_read_seconds_total", "counter", "Time spent fetching and verifying shared entries.", "",
         t.read_ms / 1000.0},
        {"skippy_shared_write_seconds_total", "counter", "Time spent storing shared entries.", "", t.write_ms / 1000.0},
    };
    AppendSamples(o, samples);
  }
  head("skippy_lanes", "gauge", "Runtime lanes.");
  StrAppend(&o, "skippy_lanes ", g.lanes_total, "\n");
  head("skippy_lanes_busy", "gauge", "Lanes serving a request.");
  StrAppend(&o, "skippy_lanes_busy ", g.lanes_busy, "\n");
  head("skippy_queue_depth", "gauge", "Requests waiting for a lane.");
  StrAppend(&o, "skippy_queue_depth ", g.queue_depth, "\n");
  head("skippy_model_loading", "gauge", "1 while the model is loading.");
  StrAppend(&o, "skippy_model_loading ", g.loading ? 1 : 0, "\n");
  head("skippy_ttft_seconds", "histogram", "Time from arrival to the first generated token, in the server.");
  for (size_t i = 0; i < kTtftBuckets.size(); ++i) {
    StrAppend(&o, "skippy_ttft_seconds_bucket{le=\"", kTtftBuckets[i], "\"} ", ttft_buckets_[i], "\n");
  }
  StrAppend(&o, "skippy_ttft_seconds_bucket{le=\"+Inf\"} ", ttft_count_, "\n");
  StrAppend(&o, "skippy_ttft_seconds_sum ", ttft_sum_, "\n");
  StrAppend(&o, "skippy_ttft_seconds_count ", ttft_count_, "\n");
  return o;
}

}  // namespace skippy::server
