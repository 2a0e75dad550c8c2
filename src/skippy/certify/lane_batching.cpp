#include "skippy/certify/lane_batching.h"

#include <algorithm>
#include <vector>

#include "skippy/certify/logits.h"
#include "skippy/certify/state_handoff.h"
#include "skippy/common/strings.h"

namespace skippy::certify {

nlohmann::json LaneBatchingReport::ToJson() const {
  return {{"tokens_a", tokens_a}, {"tokens_b", tokens_b}, {"lane_a_equal", a_equal},
          {"lane_b_equal", b_equal}, {"pass", pass}};
}

namespace {

using runtime::Engine;
using runtime::Token;

bool HasRecurrentState(const Engine& engine) { return engine.model().is_recurrent() || engine.model().is_hybrid(); }

// Steps `lanes` (each holding the first lengths[i] of `tokens`) twice with `next` tokens and
// returns the logits per lane and step; puts the lanes back to their prompts afterwards (cut back,
// or prefilled again where recurrent state cannot be cut).
StatusOr<std::vector<std::vector<float>>> StepTwice(Engine& engine, std::span<const int32_t> lanes,
                                                    std::span<const int32_t> lengths, std::span<const Token> tokens,
                                                    Token next) {
  std::vector<std::vector<float>> out(lanes.size() * 2);
  for (int step = 0; step < 2; ++step) {
    std::vector<Engine::DecodeStepIn> in;
    for (size_t i = 0; i < lanes.size(); ++i) in.push_back({lanes[i], next, lengths[i] + step});
    SKIPPY_ASSIGN_OR_RETURN(auto logits, engine.DecodeStep(in));
    for (size_t i = 0; i < lanes.size(); ++i) out[2 * i + static_cast<size_t>(step)] = std::move(logits[i]);
  }
  for (size_t i = 0; i < lanes.size(); ++i) {
    if (HasRecurrentState(engine)) {
      SKIPPY_RETURN_IF_ERROR(engine.Clear(lanes[i]));
      SKIPPY_RETURN_IF_ERROR(engine.Prefill(lanes[i], tokens.first(static_cast<size_t>(lengths[i])), 0));
    } else {
      SKIPPY_RETURN_IF_ERROR(engine.Truncate(lanes[i], lengths[i]));
    }
  }
  return out;
}

StatusOr<LaneBatchingReport> Run(Engine& engine, int32_t a, int32_t b) {
  const int32_t cap = engine.LaneCapacity();
  // Lane b's KV spans more 256-cell steps than lane a's (40 and 600 cells) where the context allows.
  const int32_t len_b = std::min<int32_t>(600, cap - 4);
  const int32_t len_a = std::max<int32_t>(2, std::min<int32_t>(40, len_b / 4));
  SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> tokens,
                          BenchmarkTokens(engine.model(), "Lane batching check: two lanes, one batch.", len_b));
  SKIPPY_RETURN_IF_ERROR(engine.Prefill(a, std::span(tokens).first(static_cast<size_t>(len_a)), 0));
  SKIPPY_RETURN_IF_ERROR(engine.Prefill(b, tokens, 0));
  const Token next = tokens[1];
  const int32_t la[] = {a}, lb[] = {b}, both[] = {a, b};
  const int32_t na[] = {len_a}, nb[] = {len_b}, nboth[] = {len_a, len_b};
  SKIPPY_ASSIGN_OR_RETURN(auto alone_a, StepTwice(engine, la, na, tokens, next));
  SKIPPY_ASSIGN_OR_RETURN(auto alone_b, StepTwice(engine, lb, nb, tokens, next));
  SKIPPY_ASSIGN_OR_RETURN(auto together, StepTwice(engine, both, nboth, tokens, next));
  LaneBatchingReport r;
  r.tokens_a = static_cast<size_t>(len_a);
  r.tokens_b = static_cast<size_t>(len_b);
  r.a_equal = BytesEqual(alone_a[0], together[0]) && BytesEqual(alone_a[1], together[1]);
  r.b_equal = BytesEqual(alone_b[0], together[2]) && BytesEqual(alone_b[1], together[3]);
  r.pass = r.a_equal && r.b_equal;
  return r;
}

// Each lane's chunk (where `chunks[i]` is not empty) or step (where it is), alone (separately) or
// in one DecodeStepWithChunks; then a step of all lanes together. Returns the logits of each lane's
// chunk (its last row; none for `quiet_lane`'s, which asks for no output row, as a prompt's middle
// chunk) or step, in lane order, then those of the step after.
StatusOr<std::vector<std::vector<float>>> ChunksAndSteps(Engine& engine, std::span<const int32_t> lanes,
                                                         std::span<const int32_t> lengths,
                                                         std::span<const std::span<const Token>> chunks, Token next,
                                                         bool mixed, int32_t quiet_lane = -1) {
  std::vector<std::vector<float>> out(lanes.size());
  if (mixed) {
    std::vector<Engine::ChunkIn> in_chunks;
    std::vector<Engine::DecodeStepIn> steps;
    std::vector<size_t> chunk_of, step_of;
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (chunks[i].empty()) {
        steps.push_back({lanes[i], next, lengths[i]});
        step_of.push_back(i);
      } else {
        in_chunks.push_back({lanes[i], chunks[i], lengths[i], lanes[i] != quiet_lane});
        chunk_of.push_back(i);
      }
    }
    SKIPPY_ASSIGN_OR_RETURN(auto r, engine.DecodeStepWithChunks(steps, in_chunks));
    for (size_t j = 0; j < chunk_of.size(); ++j) out[chunk_of[j]] = std::move(r.chunks[j]);
    for (size_t j = 0; j < step_of.size(); ++j) out[step_of[j]] = std::move(r.steps[j]);
  } else {
    for (size_t i = 0; i < lanes.size(); ++i) {
      if (chunks[i].empty()) {
        const Engine::DecodeStepIn s{lanes[i], next, lengths[i]};
        SKIPPY_ASSIGN_OR_RETURN(auto one, engine.DecodeStep(std::span(&s, 1)));
        out[i] = std::move(one[0]);
      } else if (lanes[i] == quiet_lane) {
        SKIPPY_RETURN_IF_ERROR(engine.Prefill(lanes[i], chunks[i], lengths[i]));
      } else {
        SKIPPY_ASSIGN_OR_RETURN(out[i], engine.Decode(lanes[i], chunks[i], lengths[i]));
      }
    }
  }
  std::vector<Engine::DecodeStepIn> all;
  for (size_t i = 0; i < lanes.size(); ++i) {
    all.push_back({lanes[i], next, engine.SequenceLength(lanes[i])});
  }
  SKIPPY_ASSIGN_OR_RETURN(auto after, engine.DecodeStep(all));
  for (auto& l : after) out.push_back(std::move(l));
  for (size_t i = 0; i < lanes.size(); ++i) SKIPPY_RETURN_IF_ERROR(engine.Truncate(lanes[i], lengths[i]));
  return out;
}

// Whether every logits vector of one ChunksAndSteps is byte-identical to the other's in [from, to).
bool EqualIn(const std::vector<std::vector<float>>& x, const std::vector<std::vector<float>>& y, size_t from,
             size_t to) {
  if (x.size() < to || y.size() < to) return false;
  for (size_t i = from; i < to; ++i) {
    if (!BytesEqual(x[i], y[i])) return false;
  }
  return true;
}

StatusOr<StepWithChunkReport> RunStepWithChunk(Engine& engine, std::span<const int32_t> lanes) {
  const int32_t cap = engine.LaneCapacity();
  const int32_t chunk_rows = 24, second_chunk_rows = 11;
  const int32_t len_b = std::min<int32_t>(600, cap - 4 - second_chunk_rows);
  const int32_t len_a = std::min<int32_t>(40, len_b / 4);
  const int32_t lengths_all[] = {len_a, len_b, 3};
  const std::span<const int32_t> lengths = std::span(lengths_all).first(lanes.size());
  SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> tokens,
                          BenchmarkTokens(engine.model(), "Step with a chunk check: a prompt chunk beside decode rows.",
                                          len_b + chunk_rows));
  for (size_t i = 0; i < lanes.size(); ++i) {
    SKIPPY_RETURN_IF_ERROR(engine.Prefill(lanes[i], std::span(tokens).first(static_cast<size_t>(lengths[i])), 0));
  }
  const std::span<const Token> chunk = std::span(tokens).subspan(static_cast<size_t>(len_a), chunk_rows);
  const std::span<const Token> second = std::span(tokens).subspan(static_cast<size_t>(len_b), second_chunk_rows);
  const Token next = tokens[1];
  const size_t n = lanes.size();
  // A chunk into lane a beside the steps of the others; then chunks into lanes a and b beside the
  // step of c, where there is one.
  std::vector<std::span<const Token>> one_chunk(n), two_chunks(n);
  one_chunk[0] = two_chunks[0] = chunk;
  two_chunks[1] = second;
  StepWithChunkReport r;
  r.chunk_rows = static_cast<size_t>(chunk_rows);
  r.lanes_stepping = n - 1;
  {
    SKIPPY_ASSIGN_OR_RETURN(auto alone, ChunksAndSteps(engine, lanes, lengths, one_chunk, next, /*mixed=*/false));
    SKIPPY_ASSIGN_OR_RETURN(auto mixed, ChunksAndSteps(engine, lanes, lengths, one_chunk, next, /*mixed=*/true));
    r.chunk_equal = EqualIn(alone, mixed, 0, 1);
    r.steps_equal = EqualIn(alone, mixed, 1, n);
    r.next_equal = EqualIn(alone, mixed, n, 2 * n);
  }
  {
    SKIPPY_ASSIGN_OR_RETURN(auto alone, ChunksAndSteps(engine, lanes, lengths, two_chunks, next, /*mixed=*/false));
    SKIPPY_ASSIGN_OR_RETURN(auto mixed, ChunksAndSteps(engine, lanes, lengths, two_chunks, next, /*mixed=*/true));
    r.chunks_together_equal = EqualIn(alone, mixed, 0, 2 * n);
  }
  {
    // Runs of equal lengths take another path through llama.cpp's split (on lanes that follow each
    // other, its stock multi-stream ubatch); lane b's chunk asks for no output row.
    std::vector<std::span<const Token>> equal(n);
    equal[0] = chunk.first(second_chunk_rows);
    equal[1] = second;
    SKIPPY_ASSIGN_OR_RETURN(auto alone, ChunksAndSteps(engine, lanes, lengths, equal, next, false, lanes[1]));
    SKIPPY_ASSIGN_OR_RETURN(auto mixed, ChunksAndSteps(engine, lanes, lengths, equal, next, true, lanes[1]));
    r.chunks_together_equal = r.chunks_together_equal && EqualIn(alone, mixed, 0, 2 * n);
  }
  r.pass = r.chunk_equal && r.steps_equal && r.next_equal && r.chunks_together_equal;
  return r;
}

}  // namespace

nlohmann::json StepWithChunkReport::ToJson() const {
  return {{"chunk_rows", chunk_rows}, {"lanes_stepping", lanes_stepping}, {"chunk_equal", chunk_equal},
          {"steps_equal", steps_equal}, {"next_step_equal", next_equal},
          {"chunks_together_equal", chunks_together_equal}, {"pass", pass}};
}

StatusOr<StepWithChunkReport> CheckStepWithChunk(Engine& engine, int32_t a, int32_t b, int32_t c) {
  if (!engine.CanStepWithChunk()) {
    return absl::FailedPreconditionError("this engine cannot step lanes beside a prompt chunk");
  }
  if (a == b || a == c || b == c) return absl::FailedPreconditionError("the check needs different lanes");
  if (engine.LaneCapacity() < 64) return absl::FailedPreconditionError("the lanes are too small for the check");
  std::vector<int32_t> lanes = {a, b};
  if (c >= 0) lanes.push_back(c);
  for (int32_t l : lanes) SKIPPY_RETURN_IF_ERROR(engine.Clear(l));
  auto r = RunStepWithChunk(engine, lanes);
  for (int32_t l : lanes) (void)engine.Clear(l);
  return r;
}

StatusOr<LaneBatchingReport> CheckLaneBatching(Engine& engine, int32_t lane_a, int32_t lane_b) {
  if (!engine.CanDecodeSteps()) {
    return absl::FailedPreconditionError("this model's lanes cannot step together (recurrent state)");
  }
  if (lane_a == lane_b) return absl::FailedPreconditionError("the check needs two different lanes");
  if (engine.LaneCapacity() < 8) return absl::FailedPreconditionError("the lanes are too small for the check");
  SKIPPY_RETURN_IF_ERROR(engine.Clear(lane_a));
  SKIPPY_RETURN_IF_ERROR(engine.Clear(lane_b));
  auto r = Run(engine, lane_a, lane_b);
  (void)engine.Clear(lane_a);
  (void)engine.Clear(lane_b);
  return r;
}

}  // namespace skippy::certify
