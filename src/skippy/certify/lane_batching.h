// Lane-batching check: proves, for one loaded model and context, that a lane's generated-token
// logits from Engine::DecodeStep do not depend on which other lanes step with it.
//
// Why the server needs it: skippy-server decodes the generated tokens of all its busy lanes in one
// llama_decode when this check passes (one at a time otherwise). An answer must not change with
// the traffic it shares the server with, so a lane's row has to come out the same alone and next
// to others. On the pinned llama.cpp's CPU backend a lone query row per KV stream does not: its
// attention result moves with the KV length of the longest stream in the batch, and one output
// row takes another vocabulary-projection kernel than two. Two rows per lane, both output
// (Engine::DecodeStep's pad row), do; so does one row per lane with the patch series' one-row
// class (runtime::OneRowClass), which also lets recurrent and hybrid lanes step together. Other
// builds may differ, hence the check.
//
// Method: lane a holds a short prompt, lane b a long one (40 and 600 tokens where the context
// allows: their KV lengths fall in different 256-cell steps). Each lane steps alone, then both step together, then
// together again one token further; pass: each lane's logits are byte-identical alone and together
// at both steps. Between runs the lanes are cut back to their prompts (prefilled again when they
// hold recurrent state). The lanes are cleared before and after.
//
// Thread-safety: uses the engine; call it from the thread that owns the engine.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"
#include "skippy/runtime/engine.h"

namespace skippy::certify {

struct LaneBatchingReport {
  size_t tokens_a = 0, tokens_b = 0;  // prompt lengths of the two lanes
  bool a_equal = false, b_equal = false;
  bool pass = false;
  nlohmann::json ToJson() const;
};

// FailedPrecondition when the engine cannot step lanes together (Engine::CanDecodeSteps), a == b,
// or the lanes hold fewer than 8 cells; otherwise fails only when the engine does.
StatusOr<LaneBatchingReport> CheckLaneBatching(runtime::Engine& engine, int32_t lane_a, int32_t lane_b);

}  // namespace skippy::certify
