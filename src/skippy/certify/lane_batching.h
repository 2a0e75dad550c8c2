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
// at both steps. Lanes apart (0 and 2) with Engine::CanStepLanesApart make the together step a
// ragged one (one graph), which is how skippy-server checks its ragged steps. Between runs the lanes are cut back to their prompts (prefilled again when they
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

// Step-with-chunk check: proves, for one loaded model and context, that Engine::DecodeStepWithChunks
// (prompt chunks of some lanes and a generated token of others in one graph) gives every row the
// bits it gets alone. skippy-server puts decoding lanes' tokens beside a prompt chunk, or several
// lanes' chunks in one graph, only when it passes (each row is computed as in a ubatch of its own
// lane's rows, and the one-row class makes every size one class, but another build or backend may
// differ).
//
// Method: lane a holds 40 tokens and lane b 600 (their KV lengths in different 256-cell steps,
// where the context allows), and lane c, where there is one, 3. Alone: a 24-row chunk into lane a
// (its last row's logits), one step of b, one of c; then each lane one step further, all together.
// Mixed: the lanes cut back to their prompts, the chunk and the two steps in one
// DecodeStepWithChunks, then the same step of all lanes together. Then the same with an 11-row
// chunk into lane b in place of its step (two chunks of unequal lengths in one graph), and with
// 11-row chunks into lanes a and b, b's without an output row (runs of equal lengths). Pass: every
// logits vector byte-identical both ways (the step after shows that the KV the mixed step wrote is
// the KV written alone). Lanes are cleared before and after.
struct StepWithChunkReport {
  size_t chunk_rows = 0, lanes_stepping = 0;
  bool chunk_equal = false, steps_equal = false, next_equal = false;
  bool chunks_together_equal = false;  // the two-chunk cases (and c's step) in one graph
  bool pass = false;
  nlohmann::json ToJson() const;
};

// FailedPrecondition when the engine cannot step lanes beside a chunk (Engine::CanStepWithChunk),
// two lanes the same, or the lanes hold fewer than 64 cells; otherwise fails only when the engine does.
// `c` < 0: two lanes only.
StatusOr<StepWithChunkReport> CheckStepWithChunk(runtime::Engine& engine, int32_t a, int32_t b, int32_t c = -1);

}  // namespace skippy::certify
