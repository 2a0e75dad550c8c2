// Decode groups: how the scheduler splits the lanes that decode in one round into
// Engine::DecodeStep calls, when lanes decode together (--lane-batching).
//
// Why: a step of k lanes costs what its k rows cost the kernels, and on some models and CPUs
// that is more than k steps of one lane. On a 2-core CPU with a Q4_K_M model the Q6_K tensors'
// dot products (llama.cpp's x86 build has no multi-row kernel for them) cost k times one row,
// and the one-row class multiplies up to three rows of repacked Q4_K weights as a padded group
// of four, so a step of two lanes took 2.4x one lane's and a step of four 3.2x
// (docs/evidence/decode-groups/). Lane batching makes every split exact (each lane's row gets
// the same bits alone and beside others: the one-row class, or a pad row per lane, proved by
// certify::CheckLaneBatching at startup), so the split can be chosen for speed alone.
//
// Method: MeasureDecodeSteps times a step of k = 1..max_rows lanes at startup, each lane holding
// a short prompt, the fastest of `rounds` each; DecodeGroups then cuts each round's decoding lanes
// into the groups whose measured costs add up to the least. The measure holds short contexts:
// a lane's attention costs the same in any group, so it changes every split's sum alike.
//
// Whether to keep the one-row class at all (--one-row-class=auto, the default): in it a lone
// decode step takes the batch kernels, which lets lanes step together and a lane keep its answer,
// and on some models that lone step costs more than the default kernels' row path (flash
// attention's tiled path for one query row, the IQ panel; docs/evidence/one-row-class/), on others
// less. MeasureLoneStep times a lane's lone step both ways at startup, so the scheduler keeps the
// class only where it costs a lone lane nothing it can measure.
//
// Thread-safety: MeasureDecodeSteps and MeasureLoneStep use the engine (call them from the thread
// that owns it, before it serves); DecodeGroups is a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"
#include "skippy/runtime/engine.h"

namespace skippy::server {

struct DecodeStepCosts {
  std::vector<double> step_ms;  // step_ms[k - 1]: the fastest step of lanes 0..k-1 together
  size_t context = 0;           // tokens each lane held before its first measured step
  nlohmann::json ToJson() const;
};

// Steps lanes 0..k-1 together for k = 1..max_rows (at most the engine's lanes), `rounds` times
// each, the k in a rotated order each round. The lanes are cleared before and after.
// FailedPrecondition when the engine cannot step lanes together or its lanes are too small;
// otherwise fails only when the engine does.
StatusOr<DecodeStepCosts> MeasureDecodeSteps(runtime::Engine& engine, size_t max_rows = 8, size_t rounds = 3);

// A lone decode step with the one-row class on and with it off, on one model and CPU.
struct LoneStepCost {
  size_t context = 0;    // tokens the lane held before its first measured step
  size_t pairs = 0;      // measured pairs (after one warm-up pair)
  double class_ms = 0;   // median step, one-row class on
  double default_ms = 0; // median step, one-row class off
  double ratio = 0;      // median over the pairs of class / default (each pair back to back)
  nlohmann::json ToJson() const;
};

// Fills lane 0 with up to `max_context` tokens (in chunks, stopping early once the fill has taken
// `fill_budget_ms`, so a large model's startup stays short), then decodes one row at a time,
// alternating the one-row class on and off, `pairs` pairs after a warm-up pair. Attention's share
// of a step grows with the context, which is why the lane is filled first. The lane is cleared
// before and after, and the class is left as it was found. FailedPrecondition when this build has
// no one-row class or the lane is too small; otherwise fails only when the engine does.
StatusOr<LoneStepCost> MeasureLoneStep(runtime::Engine& engine, size_t max_context = 512,
                                       double fill_budget_ms = 1000, size_t pairs = 7);

// Splits `lanes` (ascending lane ids) into DecodeStep groups. Stock llama.cpp puts only consecutive
// sequences into one ubatch, so without `ragged` lanes whose ids do not follow each other are never
// grouped (they would run as separate graphs anyway); with it (Engine::CanStepLanesApart: one graph
// for any lanes, which costs about what a step of as many consecutive lanes costs: within 4% on the
// bench models, 10% more on Falcon-H1, docs/evidence/ragged-steps/) all of `lanes` are one run.
// Each run is cut into groups of at most step_ms.size() lanes whose costs add up to the least (a
// tie goes to fewer groups). With no costs, every run is one group.
std::vector<std::vector<int32_t>> DecodeGroups(std::span<const int32_t> lanes, std::span<const double> step_ms,
                                               bool ragged = false);

}  // namespace skippy::server
