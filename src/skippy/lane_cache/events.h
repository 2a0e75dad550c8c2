// CacheEvent: what the cache on the lanes tells an observer about what it holds, as it changes:
// an entry stored or removed, a namespace cleared, what a lane keeps of its last prompt.
// skippy-server streams these to skippy-router (GET /cache/events), which routes each request to
// the replica holding the longest prefix of it, the way NVIDIA Dynamo's KV router learns from its
// workers' KV events instead of guessing from text.
//
// Events carry the tenant namespace as given to LaneCache::Begin (never a clear epoch); an
// observer that misses events (a reconnect) knows less than the cache holds, never more than it
// held: nothing is ever served because of an event, they only steer routing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "skippy/cache/radix_index.h"

namespace skippy::lane_cache {

using Token = cache::Token;

struct CacheEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kCleared, kLane };
  Kind kind = Kind::kStored;
  uint64_t entry = 0;             // kStored, kRemoved: the entry's id in this process
  int32_t lane = -1;              // kLane
  std::string tenant_namespace;   // kStored, kLane, kCleared (unless all)
  bool all = false;               // kCleared: every namespace
  std::vector<Token> tokens;      // kStored: the entry's; kLane: what the lane keeps (empty: nothing)
  bool serves_shorter = false;    // kStored: the entry serves prefixes shorter than itself
};

std::string_view CacheEventKindName(CacheEvent::Kind kind);  // "stored", "removed", "cleared", "lane"

// Called on the engine thread; must not block (skippy-server appends to a ring buffer).
using CacheEventSink = std::function<void(CacheEvent)>;

}  // namespace skippy::lane_cache
