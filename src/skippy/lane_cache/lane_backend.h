// LaneBackend: what the lane cache needs from a runtime, and nothing more: the lanes' memory, the
// bytes of their state, and the facts fixed at load. EngineBackend (engine_backend.h) puts a
// runtime::Engine behind it; the unit tests put a fake behind it, so the lane cache is tested
// without llama.cpp or model files.
//
// Contract: the methods mean what the runtime::Engine methods of the same names mean
// (runtime/engine.h): every one validates its arguments and returns a Status rather than reaching
// a llama.cpp abort; Import* and RestoreRecurrentOnto leave the lane empty (or untouched, where
// the engine says so) on failure. Lanes are [0, facts().lane_count).
//
// Thread-safety: engine thread only, like the engine behind it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "skippy/cache/family_policy.h"
#include "skippy/cache/payload_kind.h"
#include "skippy/cache/prefix_identity.h"
#include "skippy/common/status.h"

namespace skippy::lane_cache {

using Token = cache::Token;

// What the backend knows once the model and context are open.
struct BackendFacts {
  cache::FamilyDecision family;  // enabled + payload kind (cache::FamilyPolicy)
  bool hybrid_memory = false;    // attention KV and recurrent state in one sequence
  int32_t n_swa = 0;             // sliding window of the SWA layers, 0 without them
  bool swa_full = false;         // SWA layers hold every cell of the context (no cell is reused)
  // The long batch class's smallest batch (runtime::MinExactBatch): a token's bits depend on the
  // class of the batch it was prefilled in, and on nothing else about the batch.
  size_t min_exact_batch = 2;
  uint32_t lane_count = 1;
  // Bytes before the first stream of a state export (runtime::kStateHeaderBytes): a recurrent
  // part to restore onto a lane is this header plus the bytes from RecurrentOffset on.
  size_t state_header_bytes = 0;
  // The configuration every cached prefix is keyed by (model, kernels, KV layout, threads ...).
  cache::CacheConfigIdentity identity;
};

class LaneBackend {
 public:
  virtual ~LaneBackend() = default;

  virtual const BackendFacts& facts() const = 0;

  // Tokens in the lane (0 when empty).
  virtual int32_t SequenceLength(int32_t lane) const = 0;
  // Lowest position the lane still holds (its SWA layers' for sliding-window caches); -1 if empty.
  virtual int32_t SequenceFirstPosition(int32_t lane) const = 0;
  // n for a lane restored from a padded sliding-window import of n tokens (it may not be cut
  // shorter than n), 0 otherwise.
  virtual int32_t PaddedPrefix(int32_t lane) const = 0;

  virtual Status Clear(int32_t lane) = 0;
  // Drops positions >= n_tokens (attention KV only; FailedPrecondition for recurrent memory).
  virtual Status Truncate(int32_t lane, int32_t n_tokens) = 0;
  // Computes `tokens` as prompt rows in one batch, appended at pos0 == SequenceLength(lane); no
  // logits. REQUIRES: at least facts().min_exact_batch tokens, so the rows are computed in the
  // class a recompute of a longer prompt computes them in.
  virtual Status Prefill(int32_t lane, std::span<const Token> tokens, int32_t pos0) = 0;

  // ResidentKv: the lane's attention KV as bytes, and back (clears the lane first). `tokens`: the
  // prefix the bytes hold (a sliding-window import is padded back to position 0 with them).
  virtual StatusOr<std::vector<uint8_t>> ExportResident(int32_t lane) = 0;
  virtual Status ImportResident(std::span<const uint8_t> bytes, int32_t lane, std::span<const Token> tokens) = 0;

  // KvRecurrent (and the diagnostic kinds): the lane's state, and back (clears the lane first).
  // kRecurrentOnly exports only the recurrent part.
  virtual StatusOr<std::vector<uint8_t>> ExportState(int32_t lane, cache::PayloadKind kind) = 0;
  virtual Status ImportState(std::span<const uint8_t> bytes, int32_t lane, cache::PayloadKind kind) = 0;
  // Hybrids: restores a recurrent part onto a lane whose attention KV already holds the entry's
  // n_tokens, and cuts the attention KV there.
  virtual Status RestoreRecurrentOnto(std::span<const uint8_t> recurrent_part, int32_t lane, int32_t n_tokens) = 0;

  // The state format (runtime/sequence_state.h). Where the recurrent block of a hybrid export starts.
  virtual StatusOr<size_t> RecurrentOffset(std::span<const uint8_t> hybrid_state) const = 0;
  // The export of a lane at n_tokens, built from a later export of the same lane and the recurrent
  // part copied at n_tokens (byte-identical to exporting then).
  virtual StatusOr<std::vector<uint8_t>> StateAt(std::span<const uint8_t> later, size_t n_tokens,
                                                 std::span<const uint8_t> recurrent_part) const = 0;
};

}  // namespace skippy::lane_cache
