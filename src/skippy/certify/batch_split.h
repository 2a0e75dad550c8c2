// Batch-split check: proves, for one loaded model and context, that a prompt's logits do not depend
// on how its prefill is cut into batches, as long as every batch has at least
// Engine::MinExactBatch() rows.
//
// Why the serving cache needs it: a hit restores a prefix that was prefilled in one set of batches
// and prefills the rest in another, while a recompute (--no-cache, llama-server) cuts the same
// prompt elsewhere. On the pinned llama.cpp's CPU kernels a token's KV and logits depend in the
// last bits on its batch's size class only: with flash attention on, 1 row / 2-63 rows / 64+ rows
// (the tiled kernel starts at 64 query rows); with it off, 1 row / 2+ rows (llamafile's sgemm
// takes matrix products from 2 columns). docs/DESIGN.md has the measurement. Other builds, CPUs
// and weight types (repacked quantizations, GPU backends) may draw other lines, so skippy-server
// runs this check at startup and serves without the cache when it fails.
//
// Method: the same tokens (BenchmarkTokens; 160, or 5 * min_batch if more, or fewer when the
// lane's context is smaller) are prefilled into `lane` under five fixed cuts and kRandomCuts cuts
// drawn from a fixed seed, whose batches all have at least min_batch rows (pieces longer than
// n_batch split into equal pieces); after each, one more token is decoded. The drawn cuts put
// batches of min_batch + 0..7 rows (every residue modulo 8) at the start, middle and end, between
// long batches of random length: that is what catches kernels that take rows in groups and the
// remainder another way (llama.cpp's repacked quantized products without Skippy's
// batch-invariant patch, see runtime/llama_backend.h). With a short class (flash attention on), the last rows are also cut into
// short batches in several ways (BatchSplitReport::short_cuts). Pass: the last prompt token's
// logits, the sequence's whole state after the prefill (every position's KV, recurrent state) and
// the decoded token's logits are byte-identical under every cut of a set. The lane is cleared
// before and after.
//
// Thread-safety: uses the engine; call it from the thread that owns the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"
#include "skippy/runtime/engine.h"

namespace skippy::certify {

// Drawn cuts per check (each a prefill of the check's tokens).
inline constexpr size_t kRandomCuts = 4;

struct BatchSplitReport {
  size_t min_batch = 0;                         // smallest batch any cut uses
  size_t n_tokens = 0;                          // prompt length checked
  std::vector<std::vector<size_t>> cuts;        // batch lengths of each cut; cuts[0] is the reference
  std::vector<bool> prompt_equal, state_equal, decode_equal;  // per cut, against cuts[0]
  // Only with a short class (min_batch > 2): the last min_batch - 1 rows after one long batch, in
  // one short batch (short_cuts[0], the reference) or cut into other short batches of 2+ rows, as
  // cache::BatchClasses allows.
  std::vector<std::vector<size_t>> short_cuts;
  std::vector<bool> short_prompt_equal, short_state_equal, short_decode_equal;
  bool pass = false;
  nlohmann::json ToJson() const;
};

// min_batch: the smallest batch to allow. InvalidArgument for min_batch 0, n_batch below
// 2 * min_batch, or a lane context below 5 * min_batch + 1 tokens; otherwise fails only when the
// engine does (bad lane, a decode error). The lane is empty afterwards in every case.
StatusOr<BatchSplitReport> CheckBatchSplits(runtime::Engine& engine, int32_t lane, size_t min_batch);

}  // namespace skippy::certify
