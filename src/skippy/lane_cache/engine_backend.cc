#include "skippy/lane_cache/engine_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>

#include "skippy/certify/batch_split.h"
#include "skippy/certify/state_handoff.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/sequence_state.h"


namespace skippy::lane_cache {

namespace {

cache::CacheConfigIdentity IdentityOf(runtime::Engine& engine, uint32_t prefill_chunk) {
  const runtime::Model& model = engine.model();
  const runtime::ContextOptions& eff = engine.context().options();
  cache::CacheConfigIdentity id;
  id.model_id = engine.model_digest();
  id.layer_begin = 0;
  int32_t n_layer = 1;
  if (auto bc = model.MetaString(model.arch() + ".block_count")) n_layer = std::max(1, std::atoi(bc->c_str()));
  id.layer_end = n_layer;
  id.runtime_abi = "skippy-runtime-1";
  // The kernels that computed a payload are part of its identity: the commit, the patch series and
  // whether its batch-invariant products (and their one-row class) were on.
  id.llama_version = StrCat(runtime::KernelBuild(), runtime::OneRowClass() ? "+one-row" : "");
  id.type_k = eff.type_k;
  id.type_v = eff.type_v;
  id.flash_attn = eff.flash_attn;
  id.v_trans = !eff.flash_attn;
  id.kv_unified = eff.kv_unified;
  id.swa_full = eff.swa_full;
  id.n_ctx = eff.n_ctx;
  // Threads too: the CPU kernels split output columns by thread, and a column's kernel path can
  // depend on where its chunk ends. And the smallest exact batch: entries carry batch classes
  // drawn with it (a disk entry must not be read by a server that draws them otherwise).
  id.position_config = StrCat("n_batch=", eff.n_batch, ";n_ubatch=", eff.n_ubatch, ";chunk=", prefill_chunk,
                              ";threads=", eff.n_threads, ";min_exact_batch=", engine.MinExactBatch());
  id.n_vocab = model.n_vocab();
  id.token_start = 0;
  return id;
}

}  // namespace

StatusOr<std::unique_ptr<EngineBackend>> EngineBackend::Create(runtime::Engine& engine, uint32_t prefill_chunk) {
  std::unique_ptr<EngineBackend> b(new EngineBackend(engine));
  BackendFacts& f = b->facts_;
  f.family = engine.family();
  f.hybrid_memory = engine.facts().memory_is_hybrid;
  f.n_swa = engine.model().n_swa();
  f.swa_full = engine.context().options().swa_full;
  f.min_exact_batch = engine.MinExactBatch();
  f.lane_count = engine.lane_count();
  f.state_header_bytes = runtime::kStateHeaderBytes;
  f.identity = IdentityOf(engine, prefill_chunk);
  SKIPPY_RETURN_IF_ERROR(f.identity.Validate());
  return b;
}

StatusOr<size_t> EngineBackend::RecurrentOffset(std::span<const uint8_t> hybrid_state) const {
  return runtime::HybridRecurrentOffset(hybrid_state);
}

StatusOr<std::vector<uint8_t>> EngineBackend::StateAt(std::span<const uint8_t> later, size_t n_tokens,
                                                      std::span<const uint8_t> recurrent_part) const {
  return runtime::HybridStateAt(later, n_tokens, recurrent_part);
}

ServeCheck CheckBeforeServing(runtime::Engine& engine) {
  ServeCheck c;
  auto check = certify::CheckBatchSplits(engine, 0, engine.MinExactBatch());
  if (!check.ok()) {
    c.reason = StrCat("the batch-split check could not run: ", check.status().message());
    return c;
  }
  c.report = check->ToJson();
  c.passed = check->pass;
  if (!c.passed) {
    c.reason = StrCat("the batch-split check failed: logits depend on where prefill batches of ", check->min_batch,
                      "+ rows are cut");
  }
  return c;
}

nlohmann::json CutCost::ToJson() const {
  return {{"cost_rows", cost_rows}, {"rows", rows}, {"pieces", pieces}, {"whole_ms", whole_ms}, {"cut_ms", cut_ms}};
}

StatusOr<CutCost> MeasureCutCost(runtime::Engine& engine, int32_t lane, size_t rows, size_t pieces, size_t rounds) {
  CutCost c;
  c.rows = std::min({rows, static_cast<size_t>(std::max(0, engine.LaneCapacity())),
                     static_cast<size_t>(engine.context().options().n_batch)});
  c.pieces = pieces;
  if (pieces < 2 || c.rows < pieces * engine.MinExactBatch()) {
    return absl::InvalidArgumentError(StrCat("a cut-cost measurement needs ", pieces, " batches of at least ",
                                             engine.MinExactBatch(), " rows in ", c.rows, " tokens"));
  }
  SKIPPY_ASSIGN_OR_RETURN(std::vector<runtime::Token> tokens,
                          certify::BenchmarkTokens(engine.model(), "What one more prefill batch costs.",
                                                   static_cast<int32_t>(c.rows)));
  // Each batch with its output row (a vocabulary product), which the server's intermediate chunks
  // do not compute: see the header for why the measure keeps it.
  auto prefill = [&](size_t k) -> StatusOr<double> {
    SKIPPY_RETURN_IF_ERROR(engine.Clear(lane));
    const auto start = std::chrono::steady_clock::now();
    size_t at = 0;
    for (size_t i = 1; i <= k; ++i) {
      const size_t end = c.rows * i / k;
      SKIPPY_RETURN_IF_ERROR(
          engine.Decode(lane, std::span(tokens).subspan(at, end - at), static_cast<int32_t>(at)).status());
      at = end;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  auto measure = [&]() -> Status {
    c.whole_ms = c.cut_ms = std::numeric_limits<double>::infinity();
    for (size_t r = 0; r < std::max<size_t>(1, rounds); ++r) {
      SKIPPY_ASSIGN_OR_RETURN(double whole, prefill(1));
      SKIPPY_ASSIGN_OR_RETURN(double cut, prefill(pieces));
      c.whole_ms = std::min(c.whole_ms, whole);
      c.cut_ms = std::min(c.cut_ms, cut);
    }
    return absl::OkStatus();
  };
  const Status measured = measure();
  const Status cleared = engine.Clear(lane);
  SKIPPY_RETURN_IF_ERROR(measured);
  SKIPPY_RETURN_IF_ERROR(cleared);
  const double per_row = c.whole_ms / static_cast<double>(c.rows);
  c.cost_rows = per_row > 0 ? std::max(0.0, (c.cut_ms - c.whole_ms) / static_cast<double>(pieces - 1) / per_row) : 0;
  return c;
}

}  // namespace skippy::lane_cache
