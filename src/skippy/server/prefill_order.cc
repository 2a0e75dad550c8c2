#include "skippy/server/prefill_order.h"

#include <algorithm>

namespace skippy::server {

namespace {

// NextPrefill's order: overdue lanes first (first admitted of those), then those not late before
// late ones, then the fewest steps of kRowsStep rows left, then the first admitted. A strict weak
// order (admissions are distinct).
bool Before(const PrefillCandidate& a, const PrefillCandidate& b, size_t overdue) {
  const bool a_due = a.passed_over >= overdue, b_due = b.passed_over >= overdue;
  if (a_due != b_due) return a_due;
  if (!a_due && a.late != b.late) return b.late;
  const size_t a_steps = (a.rows_left + kRowsStep - 1) / kRowsStep;
  const size_t b_steps = (b.rows_left + kRowsStep - 1) / kRowsStep;
  if (!a_due && a_steps != b_steps) return a_steps < b_steps;
  return a.admitted < b.admitted;
}

}  // namespace

std::optional<size_t> NextPrefill(std::span<const PrefillCandidate> candidates, size_t overdue) {
  std::optional<size_t> pick;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!pick || Before(candidates[i], candidates[*pick], overdue)) pick = i;
  }
  return pick;
}

PrefillTurn::PrefillTurn(size_t lanes, size_t budget_rows) : budget_rows_(budget_rows), state_(lanes, kNotRun) {}

std::optional<size_t> PrefillTurn::Next(std::span<const PrefillCandidate> candidates, size_t overdue) const {
  const std::optional<size_t> pick = NextPrefill(candidates, overdue);
  if (!pick || (rows_run_ > 0 && rows_run_ + candidates[*pick].next_rows > budget_rows_)) return std::nullopt;
  return pick;
}

void PrefillTurn::Ran(size_t lane, const PrefillCandidate& c) {
  if (state_[lane] == kNotRun) state_[lane] = rows_run_ + c.rows_left <= budget_rows_ ? kFinishing : kClosed;
  rows_run_ += c.next_rows;
}

bool JoinsChunkGroup(size_t group_first_tokens, size_t group_rows, size_t rows, size_t waiting,
                     const ChunkGroupCosts& costs) {
  if (group_first_tokens == 0) return true;
  if (costs.graph_ms <= 0 || costs.row_ms <= 0) return false;
  auto graph = [&](size_t n) { return std::max(costs.graph_ms, static_cast<double>(n) * costs.row_ms); };
  const double delay = graph(group_rows + rows) - graph(group_rows);
  const double saved = graph(group_rows) + graph(rows) - graph(group_rows + rows);
  return static_cast<double>(group_first_tokens) * delay < saved * static_cast<double>(1 + waiting);
}

std::optional<SharedPrefill> SharedPrefillToWaitFor(std::span<const int32_t> prompt, std::string_view tenant_namespace,
                                                    std::span<const InFlightPrefill> in_flight, size_t min_shared,
                                                    const SharedRestoreFn& restorable) {
  std::optional<SharedPrefill> pick;
  for (size_t i = 0; i < in_flight.size(); ++i) {
    const InFlightPrefill& f = in_flight[i];
    if (f.tenant_namespace != tenant_namespace || f.pos >= f.prompt.size()) continue;
    const size_t shared =
        static_cast<size_t>(std::mismatch(prompt.begin(), prompt.end(), f.prompt.begin(), f.prompt.end()).first - prompt.begin());
    if (shared == 0) continue;
    SharedRestore r = restorable ? restorable(i, shared) : SharedRestore{0, shared};
    // What the job would restore now: at least what the prefill in flight found itself.
    const size_t now = std::max(r.now, std::min(shared, f.restored));
    const size_t later = std::min(r.later, shared);
    if (later < now + min_shared || later <= now) continue;
    const size_t gain = later - now;
    const size_t left = f.prompt.size() - f.pos;
    if (left > (prompt.size() - now) + gain) continue;
    if (!pick || later > pick->restore) pick = SharedPrefill{i, shared, later};
  }
  return pick;
}

}  // namespace skippy::server
