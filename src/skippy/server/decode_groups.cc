#include "skippy/server/decode_groups.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "skippy/certify/state_handoff.h"
#include "skippy/common/stats.h"
#include "skippy/runtime/llama_backend.h"

namespace skippy::server {

nlohmann::json DecodeStepCosts::ToJson() const { return {{"step_ms", step_ms}, {"context", context}}; }

nlohmann::json LoneStepCost::ToJson() const {
  return {{"context", context}, {"pairs", pairs}, {"one_row_class_ms", class_ms}, {"default_ms", default_ms},
          {"ratio", ratio}};
}

namespace {

constexpr size_t kContext = 32;  // tokens each lane holds before its first measured step

StatusOr<DecodeStepCosts> Measure(runtime::Engine& engine, size_t max_rows, size_t rounds) {
  SKIPPY_ASSIGN_OR_RETURN(std::vector<runtime::Token> tokens,
                          certify::BenchmarkTokens(engine.model(), "Decode step cost: lanes stepping together.", kContext));
  std::vector<int32_t> pos(max_rows, static_cast<int32_t>(kContext));
  for (size_t lane = 0; lane < max_rows; ++lane) {
    SKIPPY_RETURN_IF_ERROR(engine.Prefill(static_cast<int32_t>(lane), tokens, 0));
  }
  DecodeStepCosts costs;
  costs.context = kContext;
  costs.step_ms.assign(max_rows, std::numeric_limits<double>::infinity());
  for (size_t round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < max_rows; ++i) {
      const size_t k = 1 + (i + round) % max_rows;
      std::vector<runtime::Engine::DecodeStepIn> in;
      for (size_t lane = 0; lane < k; ++lane) in.push_back({static_cast<int32_t>(lane), tokens[1], pos[lane]++});
      const auto start = std::chrono::steady_clock::now();
      SKIPPY_RETURN_IF_ERROR(engine.DecodeStep(in).status());
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      costs.step_ms[k - 1] = std::min(costs.step_ms[k - 1], ms);
    }
  }
  return costs;
}

StatusOr<LoneStepCost> MeasureLone(runtime::Engine& engine, size_t max_context, double fill_budget_ms, size_t pairs) {
  constexpr size_t kChunk = 64;
  SKIPPY_ASSIGN_OR_RETURN(
      std::vector<runtime::Token> tokens,
      certify::BenchmarkTokens(engine.model(), "Decode step cost: one lane alone, in one class or the other.",
                               static_cast<int32_t>(max_context)));
  LoneStepCost cost;
  const auto fill_start = std::chrono::steady_clock::now();
  while (cost.context < max_context && (cost.context == 0 || MsSince(fill_start) < fill_budget_ms)) {
    const size_t n = std::min(kChunk, max_context - cost.context);
    SKIPPY_RETURN_IF_ERROR(engine.Prefill(0, std::span(tokens).subspan(cost.context, n),
                                          static_cast<int32_t>(cost.context)));
    cost.context += n;
  }
  auto pos = static_cast<int32_t>(cost.context);
  auto step = [&](bool one_row_class) -> StatusOr<double> {
    runtime::SetOneRowClass(one_row_class);
    const runtime::Token token = tokens[static_cast<size_t>(pos) % tokens.size()];
    const auto start = std::chrono::steady_clock::now();
    SKIPPY_RETURN_IF_ERROR(engine.Decode(0, std::span(&token, 1), pos).status());
    ++pos;
    return MsSince(start);
  };
  std::vector<double> with_class, without, ratios;
  for (size_t i = 0; i <= pairs; ++i) {
    // Alternate which goes first, so a drift in the machine's speed does not favour one side.
    const bool class_first = i % 2 == 0;
    SKIPPY_ASSIGN_OR_RETURN(const double first, step(class_first));
    SKIPPY_ASSIGN_OR_RETURN(const double second, step(!class_first));
    if (i == 0) continue;  // warm-up: the first steps of a graph shape allocate
    const double on = class_first ? first : second;
    const double off = class_first ? second : first;
    with_class.push_back(on);
    without.push_back(off);
    ratios.push_back(on / off);
  }
  cost.pairs = pairs;
  cost.class_ms = Median(with_class);
  cost.default_ms = Median(without);
  cost.ratio = Median(ratios);
  return cost;
}

}  // namespace

StatusOr<LoneStepCost> MeasureLoneStep(runtime::Engine& engine, size_t max_context, double fill_budget_ms,
                                       size_t pairs) {
  if (!runtime::OneRowClassAvailable() || !runtime::BatchInvariant()) {
    return absl::FailedPreconditionError("this build has no one-row class (or runs the stock kernels)");
  }
  if (pairs == 0 || max_context == 0) return absl::InvalidArgumentError("nothing to measure");
  // The lane holds the context and two cells per pair.
  const auto capacity = static_cast<size_t>(engine.LaneCapacity());
  const size_t steps = 2 * (pairs + 1);
  if (capacity < steps + 8 + 16) return absl::FailedPreconditionError("the lane is too small for the measure");
  max_context = std::min(max_context, capacity - steps - 8);
  const bool was = runtime::OneRowClass();
  SKIPPY_RETURN_IF_ERROR(engine.Clear(0));
  auto cost = MeasureLone(engine, max_context, fill_budget_ms, pairs);
  runtime::SetOneRowClass(was);
  (void)engine.Clear(0);
  return cost;
}

StatusOr<DecodeStepCosts> MeasureDecodeSteps(runtime::Engine& engine, size_t max_rows, size_t rounds) {
  if (!engine.CanDecodeSteps()) {
    return absl::FailedPreconditionError("this model's lanes cannot step together (recurrent state)");
  }
  max_rows = std::min<size_t>(max_rows, engine.options().lane_count);
  if (max_rows == 0 || rounds == 0) return absl::InvalidArgumentError("nothing to measure");
  // Each lane holds the context and one cell per measured step (two with a pad row).
  if (static_cast<size_t>(engine.LaneCapacity()) < kContext + 2 * rounds * max_rows + 8) {
    return absl::FailedPreconditionError("the lanes are too small for the measure");
  }
  for (size_t lane = 0; lane < max_rows; ++lane) SKIPPY_RETURN_IF_ERROR(engine.Clear(static_cast<int32_t>(lane)));
  auto costs = Measure(engine, max_rows, rounds);
  for (size_t lane = 0; lane < max_rows; ++lane) (void)engine.Clear(static_cast<int32_t>(lane));
  return costs;
}

std::vector<std::vector<int32_t>> DecodeGroups(std::span<const int32_t> lanes, std::span<const double> step_ms,
                                               bool ragged) {
  std::vector<std::vector<int32_t>> groups;
  size_t begin = 0;
  while (begin < lanes.size()) {
    size_t end = begin + 1;
    while (end < lanes.size() && (ragged || lanes[end] == lanes[end - 1] + 1)) ++end;
    const size_t n = end - begin;
    if (step_ms.empty()) {
      groups.emplace_back(lanes.begin() + static_cast<ptrdiff_t>(begin), lanes.begin() + static_cast<ptrdiff_t>(end));
    } else {
      // best[m]: the least cost of the run's first m lanes; size[m]: the last group's size there.
      std::vector<double> best(n + 1, std::numeric_limits<double>::infinity());
      std::vector<size_t> size(n + 1, 0);
      best[0] = 0;
      for (size_t m = 1; m <= n; ++m) {
        for (size_t g = std::min(m, step_ms.size()); g >= 1; --g) {  // larger groups first: they win ties
          const double c = best[m - g] + step_ms[g - 1];
          if (c < best[m]) {
            best[m] = c;
            size[m] = g;
          }
        }
      }
      std::vector<std::vector<int32_t>> run;
      for (size_t m = n; m > 0; m -= size[m]) {
        run.emplace_back(lanes.begin() + static_cast<ptrdiff_t>(begin + m - size[m]),
                         lanes.begin() + static_cast<ptrdiff_t>(begin + m));
      }
      groups.insert(groups.end(), run.rbegin(), run.rend());
    }
    begin = end;
  }
  return groups;
}

}  // namespace skippy::server
