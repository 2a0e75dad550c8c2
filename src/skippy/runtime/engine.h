// Engine: one model, one llama.cpp context, and the sequence layout the cache relies on.
//
// Sequence ids of the context are split in two ranges that never collide:
//   lanes          [0, lane_count)                       where requests decode
//   cache seqs     [lane_count, lane_count + cache_seqs)  where ResidentKv prefixes stay resident
// With kv_unified (ContextOptions' default; skippy-server turns it off) all sequences share one KV
// stream, so recording and restoring a ResidentKv prefix only tags cells with another sequence id
// (llama_memory_seq_cp): no bytes move.
//
// Exactness rules the engine follows (see DESIGN.md "Bit-exact restore"):
//   - flash attention is always explicit, never "auto", so every context that exchanges state has
//     the same V layout;
//   - prefill is chunked by the caller's boundaries, never re-split by the engine except at
//     n_batch, so a hit and a miss that use the same boundaries compute the same batches;
//   - a lane is cleared before it receives a restore, so new cells follow the restored ones the
//     way they follow a recomputed prefix.
//
// Every method validates its arguments (sequence ranges, positions, token ids, payload/family
// compatibility) and returns a Status rather than reaching a llama.cpp assertion.
//
// Thread-safety: an Engine is used by one thread at a time (the server serialises decode calls
// on it); Model() may be read concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "skippy/cache/family_policy.h"
#include "skippy/cache/payload_kind.h"
#include "skippy/common/status.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/model.h"

namespace skippy::runtime {

// The fewest rows a prefill batch may have for the tokens it computes to be bit-identical to the
// same tokens computed in any other batch of at least this many rows. With the batch-invariant
// products of Skippy's patch series (BatchInvariant(), llama_backend.h): 2, flash attention on or
// off (a 1-row batch takes vector dot products). On stock kernels: 64 with flash attention on (its
// tiled path starts at 64 query rows), 2 with it off, and repacked quantized weights (Q4_K_M ...)
// have no such line at all. Measured on the pinned llama.cpp's CPU backend (docs/DESIGN.md);
// certify::CheckBatchSplits proves it for one loaded model, and skippy-server runs that check
// before it serves from the cache. `claimed` > 0 (--exact-min-batch,
// EngineOptions::min_exact_batch) replaces the rule for builds that draw the line elsewhere; only
// the batch-split check proves it.
// With the one-row class (OneRowClass(), llama_backend.h) every batch is one class: 1.
inline size_t MinExactBatch(bool flash_attn, size_t claimed = 0) {
  if (claimed > 0) return claimed;
  if (OneRowClass()) return 1;
  return (flash_attn && !BatchInvariant()) ? 64 : 2;
}

// Rows Engine::DecodeStep writes per lane: one in the one-row class, else the token and a pad row.
inline size_t DecodeStepRows() { return OneRowClass() ? 1 : 2; }

struct EngineOptions {
  std::string model_path;
  std::string model_id;          // defaults to the file's SHA-256 prefix when empty
  ContextOptions context;        // n_ctx, n_batch, threads, flash_attn, KV types ...
  uint32_t lane_count = 1;
  uint32_t cache_seq_count = 4;  // resident cache sequences
  int n_gpu_layers = 0;
  // The smallest batch of the long class, when this build, backend or CPU draws the line elsewhere
  // than MinExactBatch(context.flash_attn) (0: that). Only certify::CheckBatchSplits proves it.
  size_t min_exact_batch = 0;
};

// What a ResidentKv record holds: the cache sequence and how many tokens are resident in it.
struct ResidentRecord {
  int32_t cache_seq = -1;
  int32_t n_tokens = 0;
};

class Engine {
 public:
  [[nodiscard]] static StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options);
  ~Engine();

  const Model& model() const { return *model_; }
  Context& context() { return *context_; }
  const EngineOptions& options() const { return options_; }
  const cache::FamilyDecision& family() const { return family_; }
  // Enables a learned family (an architecture outside the table, FamilyDecision::learned) for a
  // certification run on this engine, whose verdict decides, or after such a run on this model
  // passed. No effect on any other decision.
  void EnableLearnedFamily() { family_ = cache::Certified(std::move(family_)); }
  const cache::ModelFacts& facts() const { return facts_; }
  // Hex SHA-256 of the model file (computed once at Open).
  const std::string& model_digest() const { return model_digest_; }
  uint32_t lane_count() const { return options_.lane_count; }
  uint32_t cache_seq_count() const { return options_.cache_seq_count; }
  int32_t cache_seq(uint32_t i) const { return static_cast<int32_t>(options_.lane_count + i); }
  // options().min_exact_batch, or MinExactBatch(flash_attn) for this engine's context.
  size_t MinExactBatch() const {
    return runtime::MinExactBatch(options_.context.flash_attn, options_.min_exact_batch);
  }

  // Lowest position a sequence still holds cells for (-1 when empty); for sliding-window caches the
  // SWA layers' (they drop cells older than the window when they need room).
  int32_t SequenceFirstPosition(int32_t seq) const;
  // Number of tokens currently in a sequence (pos_max + 1), 0 when empty.
  int32_t SequenceLength(int32_t seq) const;

  // Removes everything in a lane or a cache sequence. Never fails for a valid id.
  Status Clear(int32_t seq);

  // A sequence restored from a padded sliding-window import (ImportResident) of n tokens holds
  // zero-data SWA cells below n - window, masked only while it is at least n long: Truncate,
  // RecordResident and RestoreResident refuse (FailedPrecondition) a length in (0, n) for it, and
  // this returns n (0 for any other sequence).
  int32_t PaddedPrefix(int32_t seq) const;

  // Decodes tokens into `lane` at positions [pos0, pos0 + n), split only at n_batch, and returns
  // the last token's logits. REQUIRES: pos0 == SequenceLength(lane) (contiguous append).
  StatusOr<std::vector<float>> Decode(int32_t lane, std::span<const Token> tokens, int32_t pos0);
  // Decode without the output row (Context::Prefill): for prompt chunks whose logits nobody reads.
  // Leaves the same state as Decode.
  Status Prefill(int32_t lane, std::span<const Token> tokens, int32_t pos0);

  // One generated token for each of several lanes, in one llama_decode (what llama-server does with
  // its slots, without letting a lane's numbers depend on the others).
  // With the one-row class (OneRowClass()) each lane's token is one row: every batch size is one
  // class, so a lane's row comes out the same alone, next to any other lanes, and as Decode
  // computes it; recurrent and hybrid models step together too.
  // Without it each lane's token is written at `pos` together with a pad row of its own at pos + 1
  // (the same token, its logits computed and dropped), removed again afterwards. Why: on
  // llama.cpp's CPU backend a lone query row per KV stream gets an attention result that moves with
  // the KV length of the longest lane in the batch, and a lone output row takes another
  // vocabulary-projection kernel than 2+ rows; with two rows of each per lane, a lane's row comes
  // out the same whatever else is in the batch (measured; certify::CheckLaneBatching proves it per
  // model). So a lane's logits are the same alone or with any other lanes, but they are not those
  // of Decode (one row): a server uses one or the other for every generated token.
  // Lanes whose ids do not follow each other (0, 2, 3) are one graph too where
  // CanStepLanesApart(): the ragged split computes each lane's row as in a ubatch of its own
  // (tests/runtime RaggedSteps); elsewhere llama.cpp runs each run of consecutive ids as a graph
  // of its own.
  // Returns the logits per step, in order; each lane then holds pos + 1 tokens.
  // REQUIRES: distinct lanes, pos == SequenceLength(lane), pos + rows <= LaneCapacity(), every
  // lane's rows within n_ubatch (InvalidArgument otherwise). With one KV stream for all lanes
  // (kv_unified) the lanes' cells interleave, so a lane's numbers may still move with the traffic;
  // skippy-server does not batch lanes then. FailedPrecondition for recurrent and hybrid models
  // without the one-row class, whose state cannot drop the pad row (CanDecodeSteps). On a
  // llama.cpp failure every attention lane is cut back to pos.
  struct DecodeStepIn {
    int32_t lane = 0;
    Token token = 0;
    int32_t pos = 0;
  };
  StatusOr<std::vector<std::vector<float>>> DecodeStep(std::span<const DecodeStepIn> steps);
  bool CanDecodeSteps() const { return OneRowClass() || (!model_->is_recurrent() && !model_->is_hybrid()); }

  // Prompt chunks of one or more lanes and one generated token for each of other lanes (none or
  // several), in one llama_decode computed as one graph (a continuous-batching step): the patch
  // series' ragged split (ScopedRaggedSplit, llama_backend.h) computes each lane's run of rows as
  // in a ubatch of its own, and the one-row class makes every batch size one class, so every row
  // comes out as Decode, Prefill or DecodeStep compute it alone (tests/runtime MixedSteps). Saves
  // a pass over the weights per run beside the first: 5-14% of a 32-row chunk and 1-3 tokens on
  // bench Llama, little with chunks of 128+ rows (docs/evidence/mixed-steps/).
  // Each chunk is written at [pos, pos + size) and its last row's logits are returned when its
  // `logits` is set (Decode), none otherwise (Prefill); each stepping lane then holds pos + 1
  // tokens, its logits returned in order.
  // REQUIRES: CanStepWithChunk(); at least one chunk, none empty; distinct lanes across chunks and
  // steps; appends (pos == SequenceLength) within LaneCapacity(); all rows together within
  // n_ubatch (one graph). InvalidArgument or FailedPrecondition otherwise, with nothing decoded.
  // On a llama.cpp failure every lane involved is cut back.
  struct ChunkIn {
    int32_t lane = 0;
    std::span<const Token> tokens;
    int32_t pos = 0;
    bool logits = false;
  };
  struct StepWithChunksOut {
    std::vector<std::vector<float>> steps;   // per step, in order
    std::vector<std::vector<float>> chunks;  // per chunk, in order: its last row (empty unless logits)
  };
  StatusOr<StepWithChunksOut> DecodeStepWithChunks(std::span<const DecodeStepIn> steps,
                                                   std::span<const ChunkIn> chunks);
  // Whether DecodeStepWithChunks can run (one graph of runs of unequal lengths): the one-row class,
  // the ragged split in the loaded libllama, one KV stream per lane, and a family of the table
  // whose memory is attention only (no recurrent state, which needs equal runs; a learned
  // architecture might use a KV cache the ragged split does not cover).
  bool CanStepWithChunk() const;
  // Whether DecodeStep puts lanes apart in one graph: as CanStepWithChunk(), and hybrids too (a step
  // has one row per lane, equal runs, which their recurrent state takes); not a recurrent model
  // without attention (its memory is not covered by the ragged split).
  bool CanStepLanesApart() const;
  // Cells one lane can hold (llama_n_ctx_seq): its own stream's, or with kv_unified the shared
  // stream's, which the other sequences also use.
  int32_t LaneCapacity() const;

  // ResidentKv: keeps the first n_tokens of `lane` resident in cache sequence `cache_seq`
  // (replacing what it held). FailedPrecondition for a family whose payload is not ResidentKv.
  StatusOr<ResidentRecord> RecordResident(int32_t lane, int32_t n_tokens, int32_t cache_seq);
  // ResidentKv: clears `lane` and shares the first n_tokens of `record` into it. n_tokens may be
  // shorter than the record for plain KV caches; for SWA caches only while the record is not
  // longer than the window (n_swa): beyond it, the SWA layers keep only the window of the last
  // tokens and n_tokens must equal the record length.
  Status RestoreResident(const ResidentRecord& record, int32_t lane, int32_t n_tokens);

  // ResidentKv spill: the attention KV a cache sequence (or a lane) holds, as bytes for host RAM, so
  // the entry can leave the context (resident cells slow every lane's attention) and still be
  // served. FailedPrecondition for a non-ResidentKv family or an empty sequence. A sliding-window cache
  // exports only the window of its last tokens, so such bytes serve their exact length only.
  StatusOr<std::vector<uint8_t>> ExportResident(int32_t seq);
  // Clears `lane` and imports bytes from ExportResident. DataLoss if llama.cpp rejects them (the
  // lane is left empty). Truncate the lane afterwards to serve a shorter prefix. Sliding-window
  // models: the export is first padded back to position 0 (PadToPositionZero), so the window lands
  // in the cells a recompute leaves it in; `tokens` are the entry's tokens (a cell ext carries token
  // ids). FailedPrecondition if the export's layout is not recognised (nothing imported then).
  Status ImportResident(std::span<const uint8_t> bytes, int32_t lane, std::span<const Token> tokens = {});

  // Drops tokens at positions >= n_tokens from a lane (attention KV only: recurrent memory cannot
  // be cut shorter, which is FailedPrecondition). Used by borrowed resident hits to roll back.
  Status Truncate(int32_t lane, int32_t n_tokens);
  // Bytes the sequence's state would export to (KV cells plus recurrent state): the measured size
  // of what a ResidentKv entry keeps resident.
  uint64_t StateBytes(int32_t seq) const;

  // State export/import for kv-recurrent, full-state and recurrent-only payloads.
  // kv-recurrent and full-state export the whole sequence state (attention KV and recurrent
  // state); recurrent-only exports only the partial (SWA window / recurrent) state.
  StatusOr<std::vector<uint8_t>> ExportState(int32_t lane, cache::PayloadKind kind);
  // Clears `lane` and imports bytes exported by ExportState for the same kind.
  // DataLoss if llama.cpp rejects the bytes (the lane is left empty).
  Status ImportState(std::span<const uint8_t> bytes, int32_t lane, cache::PayloadKind kind);
  // KvRecurrent restore onto a lane whose attention KV already holds the payload's first n_tokens
  // (computed by an earlier prompt in this lane, in batches of the same size class as a recompute;
  // the caller knows the tokens match): imports `recurrent_part`, the recurrent state of a
  // kv-recurrent export of n_tokens (RecurrentPartOfHybridState, or an export with
  // LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY), and cuts the attention KV to n_tokens. What llama-server
  // does with its context checkpoints; it saves copying the attention KV. FailedPrecondition for a
  // non-hybrid family, a lane holding fewer tokens or an empty part (the lane is untouched);
  // DataLoss if llama.cpp rejects the state or it ends elsewhere (the lane is then cleared).
  Status RestoreRecurrentOnto(std::span<const uint8_t> recurrent_part, int32_t lane, int32_t n_tokens);

 private:
  Engine() = default;
  Status CheckLane(int32_t lane) const;
  // A valid lane holding exactly pos0 tokens (decodes only append), with room for `rows` more.
  Status CheckAppend(int32_t lane, int32_t pos0, size_t rows = 0) const;
  Status CheckCacheSeq(int32_t seq) const;
  Status CheckSeq(int32_t seq) const;
  Status CheckCut(int32_t seq, int32_t n_tokens) const;

  EngineOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Context> context_;
  cache::ModelFacts facts_;
  cache::FamilyDecision family_;
  std::string model_digest_;
  std::vector<int32_t> padded_prefix_;  // per sequence id, see PaddedPrefix
};

}  // namespace skippy::runtime
