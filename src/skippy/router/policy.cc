#include "skippy/router/policy.h"

#include <algorithm>
#include <limits>

namespace skippy::router {

std::string_view RoutedByName(RoutedBy r) {
  switch (r) {
    case RoutedBy::kPrefix: return "prefix";
    case RoutedBy::kLoad: return "load";
    case RoutedBy::kRoundRobin: return "round-robin";
  }
  return "?";
}

std::optional<Choice> Choose(Policy policy, const PolicyOptions& o, std::span<const Candidate> cs, size_t prompt_tokens,
                             uint64_t& rr) {
  const size_t n = cs.size();
  if (n == 0) return std::nullopt;
  // Ties go round robin from rr, so equal replicas share the work.
  const uint64_t start = rr++;
  auto order = [&](size_t k) { return static_cast<size_t>((start + k) % n); };
  if (policy == Policy::kRoundRobin) {
    for (size_t k = 0; k < n; ++k) {
      if (cs[order(k)].healthy) return Choice{order(k), RoutedBy::kRoundRobin};
    }
    return std::nullopt;
  }
  auto load = [&](size_t i) { return cs[i].in_flight / std::max(1.0, cs[i].lanes); };
  std::optional<size_t> idlest, busiest, best;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = order(k);
    if (!cs[i].healthy) continue;
    if (!idlest || load(i) < load(*idlest)) idlest = i;
    if (!busiest || load(i) > load(*busiest)) busiest = i;
    if (!best || cs[i].matched > cs[*best].matched || (cs[i].matched == cs[*best].matched && load(i) < load(*best))) {
      best = i;
    }
  }
  if (!idlest) return std::nullopt;
  const double lo = load(*idlest), hi = load(*busiest);
  const bool imbalanced = hi - lo > o.balance_abs && hi > o.balance_rel * lo;
  if (!imbalanced && prompt_tokens > 0 && cs[*best].matched > 0 &&
      static_cast<double>(cs[*best].matched) >= o.cache_threshold * static_cast<double>(prompt_tokens)) {
    // The prefix wins unless its replica is much busier than the idlest: balanced loads only.
    return Choice{*best, RoutedBy::kPrefix};
  }
  return Choice{*idlest, RoutedBy::kLoad};
}

}  // namespace skippy::router
