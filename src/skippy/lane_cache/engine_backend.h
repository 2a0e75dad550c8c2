// EngineBackend: a runtime::Engine behind LaneBackend, and the startup check that decides whether
// the lane cache may serve from it.
//
// Thread-safety: engine thread only, like the engine.
#pragma once

#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "skippy/lane_cache/lane_backend.h"
#include "skippy/runtime/engine.h"

namespace skippy::lane_cache {

class EngineBackend final : public LaneBackend {
 public:
  // prefill_chunk: the server's --prefill-chunk, part of the cache identity (it decides where
  // batches are cut). `engine` outlives the backend.
  [[nodiscard]] static StatusOr<std::unique_ptr<EngineBackend>> Create(runtime::Engine& engine, uint32_t prefill_chunk);

  const BackendFacts& facts() const override { return facts_; }
  int32_t SequenceLength(int32_t lane) const override { return engine_.SequenceLength(lane); }
  int32_t SequenceFirstPosition(int32_t lane) const override { return engine_.SequenceFirstPosition(lane); }
  int32_t PaddedPrefix(int32_t lane) const override { return engine_.PaddedPrefix(lane); }
  Status Clear(int32_t lane) override { return engine_.Clear(lane); }
  Status Truncate(int32_t lane, int32_t n_tokens) override { return engine_.Truncate(lane, n_tokens); }
  Status Prefill(int32_t lane, std::span<const Token> tokens, int32_t pos0) override {
    return engine_.Prefill(lane, tokens, pos0);
  }
  StatusOr<std::vector<uint8_t>> ExportResident(int32_t lane) override { return engine_.ExportResident(lane); }
  Status ImportResident(std::span<const uint8_t> bytes, int32_t lane, std::span<const Token> tokens) override {
    return engine_.ImportResident(bytes, lane, tokens);
  }
  StatusOr<std::vector<uint8_t>> ExportState(int32_t lane, cache::PayloadKind kind) override {
    return engine_.ExportState(lane, kind);
  }
  Status ImportState(std::span<const uint8_t> bytes, int32_t lane, cache::PayloadKind kind) override {
    return engine_.ImportState(bytes, lane, kind);
  }
  Status RestoreRecurrentOnto(std::span<const uint8_t> part, int32_t lane, int32_t n_tokens) override {
    return engine_.RestoreRecurrentOnto(part, lane, n_tokens);
  }
  StatusOr<size_t> RecurrentOffset(std::span<const uint8_t> hybrid_state) const override;
  StatusOr<std::vector<uint8_t>> StateAt(std::span<const uint8_t> later, size_t n_tokens,
                                         std::span<const uint8_t> recurrent_part) const override;

 private:
  explicit EngineBackend(runtime::Engine& engine) : engine_(engine) {}
  runtime::Engine& engine_;
  BackendFacts facts_;
};

// Whether restores from this engine can be exact: certify::CheckBatchSplits on lane 0 (prefill
// results must not depend on where batches of the long class are cut). `passed` false with a
// reason when it failed or could not run; `report` is its JSON (null when it did not run).
struct ServeCheck {
  bool passed = false;
  std::string reason;
  nlohmann::json report;
};
ServeCheck CheckBeforeServing(runtime::Engine& engine);

// What one more prefill batch costs on this engine, in prompt rows of the same prefill: the
// planner (RecordPolicy::cut_cost_rows) weighs an exact-boundary record that cuts a batch by it.
// A batch costs a pass over the weights beyond its rows: little on a dense Q4_K_M model, much
// where F16 weights stream again or every ubatch converts its weights again (llama.cpp's CPU
// backend decodes each used expert's IQ weight panel per ubatch on an MoE model). Method: `rows`
// tokens (fewer if the lane or n_batch is smaller) prefilled on `lane` in one batch and in
// `pieces` equal batches, alternating, `rounds` times each; the fastest of each way is kept, and
// cost_rows = ((cut_ms - whole_ms) / (pieces - 1)) / (whole_ms / rows), at least 0. The defaults
// cut 64-row pieces, the smallest the record grid makes (its dearest cuts). Each batch computes
// its last row's logits, a vocabulary product the server's intermediate chunks skip; a record
// costs more than its batch, though (a state copy or export at the boundary), and with the
// product the measure read 1-2x what a record cost per cut on bench Qwen3Next IQ2_XS and Gemma3
// F16, without it 0.25-1.3x (docs/evidence/record-cost/grid-budget/). Run it after the
// batch-split check, which warms the weights. InvalidArgument when the pieces would be under
// Engine::MinExactBatch rows; the lane is empty afterwards in every case.
struct CutCost {
  double cost_rows = 0;
  size_t rows = 0;
  size_t pieces = 0;
  double whole_ms = 0;  // fastest prefill of `rows` in one batch
  double cut_ms = 0;    // fastest prefill of `rows` in `pieces` batches
  nlohmann::json ToJson() const;
};
StatusOr<CutCost> MeasureCutCost(runtime::Engine& engine, int32_t lane, size_t rows = 192, size_t pieces = 3,
                                 size_t rounds = 2);

}  // namespace skippy::lane_cache
