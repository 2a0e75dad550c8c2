#include "skippy/lane_cache/prefill_plan.h"

#include <algorithm>

#include "skippy/cache/record_plan.h"
#include "skippy/lane_cache/warn.h"

namespace skippy::lane_cache {

namespace {

std::vector<size_t> PlanRecordBoundaries(const RecordPolicy& p, size_t n, std::span<const size_t> message_boundaries,
                                         const cache::BatchClasses& classes, size_t restored, size_t branch) {
  cache::PromptShape shape;
  shape.n_tokens = n;
  for (size_t b : message_boundaries) {
    if (b > 0 && b <= n && (shape.message_boundaries.empty() || shape.message_boundaries.back() < b)) {
      shape.message_boundaries.push_back(b);
    }
  }
  cache::RecordPlanOptions ro;
  ro.kind = cache::PayloadKind::kKvRecurrent;  // exact-boundary planning for both kinds
  ro.stride = p.stride;
  // The tail record leaves one batch of the last run's class (2 rows after a short message, the
  // long class's minimum after a long one).
  if (p.tail != 0 && !classes.runs().empty()) {
    const bool short_end = classes.runs().back().short_rows;
    ro.tail_tokens = std::max<size_t>(p.tail, short_end ? cache::BatchClasses::kMinShortBatch : p.min_batch);
  }
  // A branch within the first grid stride (a shared "Document" header) is not worth a record,
  // nor one the restored prefix already reaches.
  if (branch >= std::max(p.min_batch, p.stride) && branch >= restored + p.min_batch) ro.branch_point = branch;
  ro.max_records = std::max<size_t>(1, p.max_records);
  ro.restored_tokens = restored;  // candidates it already covers take no record slot
  // A hit that leaves a short suffix extends a prefix the cache already knows: the full-prompt,
  // branch, turn and tail records serve the next request of the same conversation or agent, and
  // grid points inside the suffix would each cost a state export. A long new part (a hit on a
  // shared header, then a new document) gets the grid like a miss.
  if (restored > 0 && n - restored < 4 * p.stride) ro.stride = 0;
  // Records where prefill cuts a long suffix anyway cost no extra batch.
  ro.free_every = p.prefill_chunk;
  if (p.cut_cost_rows > 0 && p.grid_budget > 0) {
    ro.max_paid_grid = static_cast<size_t>(p.grid_budget * static_cast<double>(n - restored) / p.cut_cost_rows);
  }
  auto rp = cache::PlanRecords(shape, ro);
  if (!rp.ok()) {
    Warn("record plan", rp.status());
    return {};
  }
  std::vector<size_t> records = rp->boundaries;
  std::sort(records.begin(), records.end());
  return records;
}

}  // namespace

PrefillPlan PlanPrefill(const RecordPolicy& p, size_t n, std::span<const size_t> message_boundaries,
                        const cache::BatchClasses& classes, size_t restored, size_t branch) {
  PrefillPlan plan;
  restored = std::min(restored, n);
  if (restored == n) return plan;
  std::vector<size_t> records;
  if (p.exact_boundaries && n >= p.min_batch) {
    records = PlanRecordBoundaries(p, n, message_boundaries, classes, restored, branch);
  }
  std::vector<size_t> inner;
  bool whole = false;
  for (size_t b : records) {
    if (b == n) {
      whole = true;
    } else if (b > restored) {
      inner.push_back(b);
    }
  }
  cache::BatchClasses::Cuts cuts = classes.Cut(restored, inner, p.prefill_chunk);
  plan.chunk_ends = std::move(cuts.batch_ends);
  plan.record_boundaries = std::move(cuts.stops);
  if (whole) plan.record_boundaries.push_back(n);
  return plan;
}

}  // namespace skippy::lane_cache
