// PrefillPlan: how a prompt is prefilled after its restored prefix -- where each batch ends and at
// which of those ends the lane is recorded. All record policy of the lane cache is here, on top of
// cache::PlanRecords (which boundaries are worth a record) and cache::BatchClasses (which batches
// keep every row in its size class).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "skippy/cache/batch_classes.h"

namespace skippy::lane_cache {

struct PrefillPlan {
  std::vector<size_t> chunk_ends;         // ascending, last == prompt size; empty when all is restored
  std::vector<size_t> record_boundaries;  // ascending, a subset of chunk_ends
};

struct RecordPolicy {
  // Exact-boundary families (KvRecurrent, sliding-window ResidentKv) decide their records before
  // prefill: recurrent state cannot be cut afterwards and a sliding-window cache keeps only the
  // window behind its last token. Others record the prompt end only, and plan nothing here.
  bool exact_boundaries = false;
  size_t min_batch = 2;       // the long class's smallest batch
  size_t prefill_chunk = 512; // rows per batch at most (>= 2 * min_batch)
  size_t stride = 64;         // record grid
  size_t max_records = 10;
  size_t tail = 0;            // also record this many tokens before the prompt end (0: no)
  // What one more prefill batch costs, in prompt rows (MeasureCutCost; 0: nothing), and how much
  // of a prefill's rows the grid's extra batches may cost (0: no budget): grid records that cut a
  // batch where prefill would not are kept while their count times cut_cost_rows stays within
  // grid_budget of the rows prefilled. The prompt end, branch, turn and tail records are not held
  // to it.
  double cut_cost_rows = 0;
  double grid_budget = 0;
};

// The batches of prompt[restored, n) and the records among their ends. Every batch stays within
// one run of `classes` and holds at least its class's smallest batch; a record boundary that
// would cut one below that (too close to the restored prefix, another boundary or a run's end) is
// dropped. branch: where the prompt leaves what the cache and the lane have seen (0: unknown).
// Records (exact-boundary families only): the prompt end, the branch point, the last turn, the
// tail; the grid only on a miss or a long new part (a short suffix after a hit extends a prefix the
// cache already knows, and a grid point there would cost an export each).
PrefillPlan PlanPrefill(const RecordPolicy& policy, size_t n_tokens, std::span<const size_t> message_boundaries,
                        const cache::BatchClasses& classes, size_t restored, size_t branch);

}  // namespace skippy::lane_cache
