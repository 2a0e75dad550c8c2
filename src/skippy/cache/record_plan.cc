#include "skippy/cache/record_plan.h"

#include <deque>
#include <utility>

#include <algorithm>
#include <string>

namespace skippy::cache {

StatusOr<RecordPlan> PlanRecords(const PromptShape& prompt, const RecordPlanOptions& options) {
  const size_t n = prompt.n_tokens;
  if (n == 0) return absl::InvalidArgumentError("record plan: empty prompt");
  if (options.restored_tokens > n) {
    return absl::InvalidArgumentError("record plan: restored_tokens " + std::to_string(options.restored_tokens) +
                                      " exceeds the prompt length " + std::to_string(n));
  }
  size_t prev = 0;
  for (size_t b : prompt.message_boundaries) {
    if (b == 0 || b > n || b <= prev) {
      return absl::InvalidArgumentError("record plan: message boundaries must be ascending and in (0, " +
                                        std::to_string(n) + "]; got " + std::to_string(b));
    }
    prev = b;
  }
  if (prompt.final_user_turn_start && *prompt.final_user_turn_start > n) {
    return absl::InvalidArgumentError("record plan: final_user_turn_start beyond the prompt");
  }

  std::vector<size_t> candidates;
  size_t grid_candidates = 0;  // the last ones of `candidates`
  size_t spread_from = 0;      // candidates from here on spread the grid over the prompt
  if (options.include_full_prompt) candidates.push_back(n);
  if (options.branch_point > 0 && options.branch_point < n) candidates.push_back(options.branch_point);
  std::optional<size_t> turn = prompt.final_user_turn_start;
  if (!turn) {
    for (auto it = prompt.message_boundaries.rbegin(); it != prompt.message_boundaries.rend(); ++it) {
      if (*it < n) {
        turn = *it;
        break;
      }
    }
  }
  if (turn && *turn > 0) candidates.push_back(*turn);
  if (options.tail_tokens > 0 && options.tail_tokens < n) candidates.push_back(n - options.tail_tokens);
  if (options.stride > 0) {
    // The grid: its two longest points below the prompt end first (a shared system prompt or document
    // followed by different short questions), then coarse to fine -- the middle of the rest, then
    // the middles of its halves, ... -- so further records spread over the whole prompt and a
    // request that diverges at a random point finds a boundary close below it.
    std::vector<size_t> grid;
    for (size_t g = options.stride; g < n; g += options.stride) grid.push_back(g);
    const size_t grid_start = candidates.size();
    if (options.free_every > 0) {
      for (size_t g = options.restored_tokens + options.free_every; g < n; g += options.free_every) {
        candidates.push_back(g);
      }
    }
    if (!grid.empty()) {
      // The last two points: the last one lies inside a short question about as often as not.
      candidates.push_back(grid.back());
      if (grid.size() >= 2) candidates.push_back(grid[grid.size() - 2]);
      spread_from = candidates.size();
      std::deque<std::pair<size_t, size_t>> ranges;  // [lo, hi) index ranges not taken yet
      ranges.emplace_back(0, grid.size() >= 2 ? grid.size() - 2 : 0);
      while (!ranges.empty()) {
        auto [lo, hi] = ranges.front();
        ranges.pop_front();
        if (lo >= hi) continue;
        const size_t mid = lo + (hi - lo) / 2;
        candidates.push_back(grid[mid]);
        ranges.emplace_back(lo, mid);
        ranges.emplace_back(mid + 1, hi);
      }
    }
    grid_candidates = candidates.size() - grid_start;
  }

  RecordPlan plan;
  const size_t limit = ServesShorterPrefixes(options.kind) ? std::min<size_t>(options.max_records, 1)
                                                           : options.max_records;
  // A grid point within half a stride of a boundary already chosen (the tail, the full prompt, a
  // branch) adds almost nothing that one does not serve: its slot goes to the next grid point.
  const size_t named = candidates.size() - grid_candidates;
  size_t paid_grid = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const size_t c = candidates[i];
    if (plan.boundaries.size() >= limit) break;
    if (c <= options.restored_tokens || c < options.min_tokens) continue;
    if (std::find(plan.boundaries.begin(), plan.boundaries.end(), c) != plan.boundaries.end()) continue;
    if (i >= named && std::any_of(plan.boundaries.begin(), plan.boundaries.end(), [&](size_t b) {
          return (b > c ? b - c : c - b) < (options.stride + 1) / 2;
        })) {
      continue;
    }
    const bool paid = spread_from > 0 && i >= spread_from &&
                      !(options.free_every > 0 && c > options.restored_tokens &&
                        (c - options.restored_tokens) % options.free_every == 0);
    if (paid && paid_grid >= options.max_paid_grid) continue;
    uint64_t charge = options.bytes_per_token * c + options.bytes_per_record;
    if (charge > options.max_bytes - plan.planned_bytes) continue;  // a shorter one may still fit
    if (paid) ++paid_grid;
    plan.boundaries.push_back(c);
    plan.planned_bytes += charge;
  }
  std::sort(plan.boundaries.begin(), plan.boundaries.end());

  std::vector<size_t> stops = plan.boundaries;
  if (stops.empty() || stops.back() != n) stops.push_back(n);
  size_t at = options.restored_tokens;
  for (size_t stop : stops) {
    if (stop <= at) continue;
    if (options.max_chunk_tokens > 0) {
      while (stop - at > options.max_chunk_tokens) {
        at += options.max_chunk_tokens;
        plan.chunk_ends.push_back(at);
      }
    }
    plan.chunk_ends.push_back(stop);
    at = stop;
  }
  return plan;
}

}  // namespace skippy::cache
