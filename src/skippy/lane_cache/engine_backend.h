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

}  // namespace skippy::lane_cache
