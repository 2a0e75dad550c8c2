// CacheEventLog: the lane cache's events (lane_cache::CacheEvent) in a bounded ring, numbered, for
// GET /cache/events (a Server-Sent Events stream that skippy-router follows to route by prefix).
// The engine thread appends without waiting on readers; a reader that falls more than `capacity`
// events behind is told so (reset) and starts again from the oldest event kept.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/lane_cache/events.h"

namespace skippy::server {

class CacheEventLog {
 public:
  explicit CacheEventLog(size_t capacity = 8192) : capacity_(capacity) {}

  void Append(lane_cache::CacheEvent event);

  struct Batch {
    std::vector<std::string> lines;  // one SSE "data:" payload (JSON) per event
    uint64_t last = 0;               // the sequence number to ask after next time
    bool reset = false;              // events after the asked one were dropped: the reader's view is stale
    bool closed = false;
  };
  // Events numbered above `after`, waiting up to `timeout` for the first one.
  Batch WaitAfter(uint64_t after, std::chrono::milliseconds timeout);
  // Wakes every reader; later reads return closed.
  void Close();
  uint64_t last() const;

  // The JSON of one event: {"seq", "kind", ...}; tenant namespaces as NamespaceKey.
  static nlohmann::json ToJson(uint64_t seq, const lane_cache::CacheEvent& event);

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, lane_cache::CacheEvent>> events_;
  uint64_t next_ = 1;
  bool closed_ = false;
};

// The key a tenant namespace is known by outside the process (events, /cache/prompt-key): hex
// XXH3-128, so a router can match namespaces without learning them.
std::string NamespaceKey(const std::string& tenant_namespace);

}  // namespace skippy::server
