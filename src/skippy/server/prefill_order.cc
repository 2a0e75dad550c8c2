#include "skippy/server/prefill_order.h"

namespace skippy::server {

std::optional<size_t> NextPrefill(std::span<const PrefillCandidate> candidates, size_t overdue) {
  auto before = [overdue](const PrefillCandidate& a, const PrefillCandidate& b) {
    const bool a_due = a.passed_over >= overdue, b_due = b.passed_over >= overdue;
    if (a_due != b_due) return a_due;
    if (!a_due && a.chunks_left != b.chunks_left) return a.chunks_left < b.chunks_left;
    return a.admitted < b.admitted;
  };
  std::optional<size_t> pick;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!pick || before(candidates[i], candidates[*pick])) pick = i;
  }
  return pick;
}

}  // namespace skippy::server
