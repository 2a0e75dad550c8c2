// Record planning: which prefix lengths of a prompt to record after (really: during) prefill.
//
// Recurrent state cannot be cut after the fact, so for kKvRecurrent (and the diagnostic kinds) the
// boundaries must be chosen before prefill and prefill must stop at each of them to capture state:
// the plan's chunk_ends are the chunk boundaries for chunked prefill. For kResidentKv one record of
// the longest planned boundary already serves every shorter prefix, so the plan holds at most one
// boundary.
//
// Candidates, in priority order, each kept only if it is > restored_tokens, >= min_tokens and fits
// the budget (max_records, max_bytes):
//   1. the full prompt (if include_full_prompt), then the branch point (if given: where this prompt
//      leaves the token paths the cache already holds, e.g. the end of a document asked about
//      before with another question);
//   2. the last message boundary before the final user turn (the system prompt + history that the
//      next turn of the same conversation will share), then n_tokens - tail_tokens (if tail_tokens);
//   3. with a grid, the chunk cuts prefill makes anyway (free_every), then the stride grid
//      (multiples of `stride` below n_tokens): the two longest points, then coarse to fine (the
//      middle of the rest, the middles of its halves, ...), so records spread out. A grid
//      point closer than half a stride to a boundary already kept is skipped (the n - tail record
//      already serves what the last grid point would); at most max_paid_grid of the spread points
//      that cut a batch.
//
// Thread-safety: pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "skippy/cache/payload_kind.h"
#include "skippy/common/status.h"

namespace skippy::cache {

struct PromptShape {
  size_t n_tokens = 0;
  // Token offsets where one chat message ends and the next begins, ascending, in (0, n_tokens].
  std::vector<size_t> message_boundaries;
  // Offset where the final user turn starts; defaults to the last message boundary < n_tokens.
  std::optional<size_t> final_user_turn_start;
};

struct RecordPlanOptions {
  PayloadKind kind = PayloadKind::kResidentKv;
  size_t stride = 0;              // grid spacing in tokens; 0 = no grid
  size_t min_tokens = 1;          // never record a shorter prefix
  size_t max_records = 4;         // budget: boundaries per prompt
  uint64_t bytes_per_token = 0;   // charge estimate: bytes_per_token * length + bytes_per_record
  uint64_t bytes_per_record = 0;  //   (recurrent state is a fixed size per record)
  uint64_t max_bytes = std::numeric_limits<uint64_t>::max();  // budget: sum of charges
  size_t restored_tokens = 0;     // already served from the cache; prefill starts here
  size_t max_chunk_tokens = 0;    // split prefill chunks to at most this many tokens; 0 = no limit
  bool include_full_prompt = true;
  // > 0: also record n_tokens - tail_tokens, right after the full prompt and the turn boundary. A
  // prompt often ends in a short cue ("Assistant:", "Next tool call:", a chat template's assistant
  // header) that the next request of the same conversation or agent replaces with the actual reply.
  size_t tail_tokens = 0;
  // > 0: also record here, right after the full prompt: where this prompt branches off prompts the
  // cache has seen (LookupResult::path_tokens). The next request on the same path will likely
  // branch at the same point (a document or system prompt followed by another question).
  size_t branch_point = 0;
  // > 0 (with a grid): prefill is cut about every this many tokens after restored_tokens anyway
  // (the prefill chunk), so a boundary at restored_tokens + k * free_every costs no extra batch;
  // those come first among the grid candidates.
  size_t free_every = 0;
  // Grid points that spread records over the prompt (all but the two longest) and cut prefill where
  // it is not cut anyway (off free_every): at most this many. Each costs one more prefill batch,
  // dear on some models (lane_cache::MeasureCutCost); the two longest serve the next short
  // question on the same text and are kept like the tail.
  size_t max_paid_grid = std::numeric_limits<size_t>::max();
};

struct RecordPlan {
  std::vector<size_t> boundaries;  // prefix lengths to record: ascending, unique
  std::vector<size_t> chunk_ends;  // prefill chunk ends after restored_tokens: ascending, unique,
                                   // containing every boundary and n_tokens
  uint64_t planned_bytes = 0;
};

// InvalidArgument for an empty prompt, boundaries out of order or out of range, or
// restored_tokens > n_tokens.
[[nodiscard]] StatusOr<RecordPlan> PlanRecords(const PromptShape& prompt, const RecordPlanOptions& options);

}  // namespace skippy::cache
