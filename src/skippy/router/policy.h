// Choosing a replica for a request, in the manner of SGLang's cache-aware router: while the
// replicas' loads are balanced, the request goes where the longest prefix of it is cached (if
// that covers enough of it), otherwise to the least loaded replica; once the loads are out of
// balance, to the least loaded one whatever the cache holds. Round robin is the baseline a
// llama-server fleet gets behind a plain balancer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace skippy::router {

enum class Policy : uint8_t { kCacheAware, kRoundRobin };

struct PolicyOptions {
  // Route by prefix only when the best replica holds at least this fraction of the prompt.
  double cache_threshold = 0.3;
  // Loads are out of balance when the busiest replica has more than this many requests per lane
  // above the idlest AND more than balance_rel times its load.
  double balance_abs = 1.0;
  double balance_rel = 1.5;
};

struct Candidate {
  bool healthy = false;
  double in_flight = 0;  // requests the router has sent there and not finished
  double lanes = 1;      // the replica's lanes (its parallel requests)
  size_t matched = 0;    // prompt tokens the replica likely holds (ReplicaView::Match)
};

enum class RoutedBy : uint8_t { kPrefix, kLoad, kRoundRobin };
std::string_view RoutedByName(RoutedBy r);  // "prefix", "load", "round-robin"

struct Choice {
  size_t replica = 0;
  RoutedBy by = RoutedBy::kLoad;
};

// nullopt when no candidate is healthy. `prompt_tokens` 0: the prompt is unknown (route by load).
// `rr_counter`: the caller's round-robin position (advanced here for kRoundRobin and for ties).
std::optional<Choice> Choose(Policy policy, const PolicyOptions& options, std::span<const Candidate> candidates,
                             size_t prompt_tokens, uint64_t& rr_counter);

}  // namespace skippy::router
