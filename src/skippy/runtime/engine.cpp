#include "skippy/runtime/engine.h"

#include <algorithm>

#include "llama.h"
#include "skippy/common/digest.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/sequence_state.h"

namespace skippy::runtime {

using cache::PayloadKind;

namespace {

// Whether the lanes' ids make one ascending run (2, 3, 4): llama.cpp's equal split then puts their
// rows in one ubatch by itself. It takes a token's sequence only when its id is the last one's
// plus one, in batch order, so 3, 2 would be two ubatches there.
bool LanesFollowEachOther(std::span<const Engine::DecodeStepIn> steps) {
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].lane != steps[0].lane + static_cast<int32_t>(i)) return false;
  }
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options) {
  if (options.lane_count == 0) return absl::InvalidArgumentError("lane count must be at least 1");
  if (options.lane_count + options.cache_seq_count > 256) {
    return absl::InvalidArgumentError(
        StrCat("lanes + cache sequences = ", options.lane_count + options.cache_seq_count, " exceeds 256"));
  }
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  ModelOptions mo;
  mo.n_gpu_layers = options.n_gpu_layers;
  SKIPPY_ASSIGN_OR_RETURN(e->model_, Model::Load(options.model_path, mo));
  SKIPPY_ASSIGN_OR_RETURN(Sha256Digest digest, Sha256File(options.model_path));
  e->model_digest_ = ToHex(digest);
  if (e->options_.model_id.empty()) e->options_.model_id = "sha256:" + e->model_digest_.substr(0, 16);

  ContextOptions co = options.context;
  co.n_seq_max = options.lane_count + options.cache_seq_count;
  SKIPPY_ASSIGN_OR_RETURN(e->context_, Context::Create(*e->model_, co));
  e->padded_prefix_.assign(co.n_seq_max, 0);

  e->facts_.arch = e->model_->arch();
  e->facts_.family_key = e->model_->MetaString("skippy.zoo.family").value_or("");
  e->facts_.tensor_names = e->model_->tensor_names();
  e->facts_.memory_is_recurrent = e->model_->is_recurrent();
  e->facts_.memory_is_hybrid = e->model_->is_hybrid();
  e->family_ = cache::FamilyPolicy().Decide(e->facts_);
  return e;
}

Engine::~Engine() = default;

Status Engine::CheckSeq(int32_t seq) const {
  if (seq < 0 || static_cast<uint32_t>(seq) >= options_.lane_count + options_.cache_seq_count) {
    return absl::InvalidArgumentError(
        StrCat("sequence id ", seq, " outside [0, ", options_.lane_count + options_.cache_seq_count, ")"));
  }
  return absl::OkStatus();
}

Status Engine::CheckLane(int32_t lane) const {
  if (lane < 0 || static_cast<uint32_t>(lane) >= options_.lane_count) {
    return absl::InvalidArgumentError(StrCat("lane ", lane, " outside [0, ", options_.lane_count, ")"));
  }
  return absl::OkStatus();
}

Status Engine::CheckCacheSeq(int32_t seq) const {
  if (seq < static_cast<int32_t>(options_.lane_count) ||
      static_cast<uint32_t>(seq) >= options_.lane_count + options_.cache_seq_count) {
    return absl::InvalidArgumentError(StrCat("cache sequence ", seq, " outside [", options_.lane_count, ", ",
                                             options_.lane_count + options_.cache_seq_count, ")"));
  }
  return absl::OkStatus();
}

int32_t Engine::SequenceLength(int32_t seq) const {
  if (!CheckSeq(seq).ok()) return 0;
  return llama_memory_seq_pos_max(llama_get_memory(context_->raw()), seq) + 1;
}

int32_t Engine::SequenceFirstPosition(int32_t seq) const {
  if (!CheckSeq(seq).ok()) return -1;
  return llama_memory_seq_pos_min(llama_get_memory(context_->raw()), seq);
}

Status Engine::Clear(int32_t seq) {
  SKIPPY_RETURN_IF_ERROR(CheckSeq(seq));
  // Removing a whole sequence never fails, recurrent memory included.
  llama_memory_seq_rm(llama_get_memory(context_->raw()), seq, -1, -1);
  padded_prefix_[seq] = 0;
  return absl::OkStatus();
}

int32_t Engine::PaddedPrefix(int32_t seq) const {
  return CheckSeq(seq).ok() ? padded_prefix_[seq] : 0;
}

Status Engine::CheckCut(int32_t seq, int32_t n_tokens) const {
  if (n_tokens > 0 && n_tokens < padded_prefix_[seq]) {
    return absl::FailedPreconditionError(
        StrCat("sequence ", seq, " came from a padded sliding-window import of ", padded_prefix_[seq],
               " tokens: cut to ", n_tokens, ", its window would hold padding cells"));
  }
  return absl::OkStatus();
}

Status Engine::CheckAppend(int32_t lane, int32_t pos0, size_t rows) const {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  const int32_t have = SequenceLength(lane);
  if (pos0 != have) {
    return absl::InvalidArgumentError(
        StrCat("decode must append: lane ", lane, " holds ", have, " tokens, asked to write at ", pos0));
  }
  if (static_cast<int64_t>(pos0) + static_cast<int64_t>(rows) > LaneCapacity()) {
    return absl::InvalidArgumentError(StrCat("lane ", lane, ": ", rows, " tokens at position ", pos0, " end past its ",
                                             LaneCapacity(), " cells"));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<float>> Engine::Decode(int32_t lane, std::span<const Token> tokens, int32_t pos0) {
  SKIPPY_RETURN_IF_ERROR(CheckAppend(lane, pos0, tokens.size()));
  return context_->Decode(tokens, pos0, lane);
}

Status Engine::Prefill(int32_t lane, std::span<const Token> tokens, int32_t pos0) {
  SKIPPY_RETURN_IF_ERROR(CheckAppend(lane, pos0, tokens.size()));
  return context_->Prefill(tokens, pos0, lane);
}

int32_t Engine::LaneCapacity() const { return static_cast<int32_t>(context_->SequenceCapacity()); }

StatusOr<std::vector<std::vector<float>>> Engine::DecodeStep(std::span<const DecodeStepIn> steps) {
  if (!CanDecodeSteps()) {
    return absl::FailedPreconditionError("a recurrent or hybrid model cannot decode lanes with pad rows");
  }
  if (steps.empty()) return absl::InvalidArgumentError("no lanes to step");
  // With the one-row class a lane's one row is computed the same in any batch: no pad row. Without
  // it, both rows of a lane must land in one ubatch (llama.cpp's equal split takes as many rows
  // from every lane), or the real row is computed alone after all.
  const size_t rows_per_lane = DecodeStepRows();
  const uint32_t n_ubatch = context_->options().n_ubatch;
  if (rows_per_lane * steps.size() > n_ubatch) {
    return absl::InvalidArgumentError(StrCat(steps.size(), " lanes need ", rows_per_lane * steps.size(),
                                             " rows, more than the ubatch of ", n_ubatch));
  }
  std::vector<Context::Row> rows;
  rows.reserve(2 * steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const DecodeStepIn& s = steps[i];
    SKIPPY_RETURN_IF_ERROR(CheckAppend(s.lane, s.pos));
    for (size_t j = 0; j < i; ++j) {
      if (steps[j].lane == s.lane) return absl::InvalidArgumentError(StrCat("lane ", s.lane, " steps twice"));
    }
    if (s.pos + static_cast<int32_t>(rows_per_lane) > LaneCapacity()) {
      return absl::InvalidArgumentError(
          StrCat("lane ", s.lane, ": no cell for ", rows_per_lane == 2 ? "the pad row after" : "a token at", " position ",
                 s.pos, " (", LaneCapacity(), " cells)"));
    }
    // The pad row is an output too: the vocabulary projection then always has 2+ rows (one row
    // takes another kernel path).
    rows.push_back({s.lane, s.pos, s.token, true});
    if (rows_per_lane == 2) rows.push_back({s.lane, s.pos + 1, s.token, true});
  }
  llama_memory_t mem = llama_get_memory(context_->raw());
  StatusOr<std::vector<std::vector<float>>> logits;
  if (rows_per_lane == 1 && !LanesFollowEachOther(steps) && CanStepLanesApart()) {
    const ScopedRaggedSplit ragged;
    logits = context_->DecodeRows(rows);
  } else {
    logits = context_->DecodeRows(rows);
  }
  if (rows_per_lane == 2 || !logits.ok()) {
    // Drop the pad rows, or on a failure everything from pos (recurrent state cannot be cut: a
    // failed step of a recurrent lane leaves it for the caller to clear).
    for (const DecodeStepIn& s : steps) {
      llama_memory_seq_rm(mem, s.lane, logits.ok() ? s.pos + 1 : s.pos, -1);
    }
  }
  if (!logits.ok()) return logits.status();
  std::vector<std::vector<float>> out;
  out.reserve(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) out.push_back(std::move((*logits)[rows_per_lane * i]));
  return out;
}

bool Engine::CanStepLanesApart() const {
  // Equal runs (one row per lane): a hybrid's recurrent state takes them too. llama.cpp's
  // is_recurrent is false for hybrids (is_hybrid): this leaves out models without attention.
  return OneRowClass() && RaggedSplitAvailable() && !options_.context.kv_unified && !model_->is_recurrent() &&
         !family_.learned && !family_.family_key.empty();
}

bool Engine::CanStepWithChunk() const {
  // Unequal runs: attention-only memory (CanStepLanesApart's, less hybrids).
  return CanStepLanesApart() && !model_->is_hybrid() && !family_.recurrent;
}

StatusOr<Engine::StepWithChunksOut> Engine::DecodeStepWithChunks(std::span<const DecodeStepIn> steps,
                                                                 std::span<const ChunkIn> chunks) {
  if (!CanStepWithChunk()) {
    return absl::FailedPreconditionError(
        "a step with prompt chunks needs the one-row class, the ragged split of the patch series, a KV stream per "
        "lane and an attention-only model of the family table");
  }
  if (chunks.empty()) return absl::InvalidArgumentError("no prompt chunk to decode");
  size_t n_rows = steps.size();
  for (const ChunkIn& c : chunks) n_rows += c.tokens.size();
  const uint32_t n_ubatch = context_->options().n_ubatch;
  if (n_rows > n_ubatch) {
    return absl::InvalidArgumentError(StrCat(chunks.size(), " chunks and ", steps.size(), " steps (", n_rows,
                                             " rows) exceed the ubatch of ", n_ubatch));
  }
  std::vector<int32_t> lanes;
  lanes.reserve(chunks.size() + steps.size());
  auto claim = [&](int32_t lane) -> Status {
    if (std::find(lanes.begin(), lanes.end(), lane) != lanes.end()) {
      return absl::InvalidArgumentError(StrCat("lane ", lane, " appears twice in one step"));
    }
    lanes.push_back(lane);
    return absl::OkStatus();
  };
  std::vector<Context::Row> rows;
  rows.reserve(n_rows);
  for (const ChunkIn& c : chunks) {
    if (c.tokens.empty()) return absl::InvalidArgumentError(StrCat("an empty prompt chunk for lane ", c.lane));
    SKIPPY_RETURN_IF_ERROR(CheckAppend(c.lane, c.pos));
    SKIPPY_RETURN_IF_ERROR(claim(c.lane));
    if (c.pos + static_cast<int64_t>(c.tokens.size()) > LaneCapacity()) {
      return absl::InvalidArgumentError(StrCat("lane ", c.lane, ": the chunk ends past its ", LaneCapacity(), " cells"));
    }
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      rows.push_back({c.lane, c.pos + static_cast<int32_t>(i), c.tokens[i], c.logits && i + 1 == c.tokens.size()});
    }
  }
  for (const DecodeStepIn& s : steps) {
    SKIPPY_RETURN_IF_ERROR(CheckAppend(s.lane, s.pos));
    SKIPPY_RETURN_IF_ERROR(claim(s.lane));
    if (s.pos + 1 > LaneCapacity()) {
      return absl::InvalidArgumentError(StrCat("lane ", s.lane, ": no cell after position ", s.pos));
    }
    rows.push_back({s.lane, s.pos, s.token, true});
  }
  StatusOr<std::vector<std::vector<float>>> logits;
  {
    const ScopedRaggedSplit ragged;
    logits = context_->DecodeRows(rows);
  }
  if (!logits.ok()) {
    llama_memory_t mem = llama_get_memory(context_->raw());
    for (const ChunkIn& c : chunks) llama_memory_seq_rm(mem, c.lane, c.pos, -1);
    for (const DecodeStepIn& s : steps) llama_memory_seq_rm(mem, s.lane, s.pos, -1);
    return logits.status();
  }
  StepWithChunksOut out;
  size_t next = 0;
  out.chunks.resize(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].logits) out.chunks[i] = std::move((*logits)[next++]);
  }
  out.steps.reserve(steps.size());
  while (next < logits->size()) out.steps.push_back(std::move((*logits)[next++]));
  return out;
}

StatusOr<ResidentRecord> Engine::RecordResident(int32_t lane, int32_t n_tokens, int32_t cache_seq) {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  SKIPPY_RETURN_IF_ERROR(CheckCacheSeq(cache_seq));
  SKIPPY_RETURN_IF_ERROR(cache::FamilyPolicy().ValidateRequest(family_, PayloadKind::kResidentKv));
  const int32_t have = SequenceLength(lane);
  if (n_tokens <= 0 || n_tokens > have) {
    return absl::InvalidArgumentError(StrCat("cannot record ", n_tokens, " tokens: lane ", lane, " holds ", have));
  }
  SKIPPY_RETURN_IF_ERROR(CheckCut(lane, n_tokens));
  llama_memory_t mem = llama_get_memory(context_->raw());
  llama_memory_seq_rm(mem, cache_seq, -1, -1);
  llama_memory_seq_cp(mem, lane, cache_seq, 0, n_tokens);
  padded_prefix_[cache_seq] = padded_prefix_[lane];
  return ResidentRecord{cache_seq, n_tokens};
}

Status Engine::RestoreResident(const ResidentRecord& record, int32_t lane, int32_t n_tokens) {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  SKIPPY_RETURN_IF_ERROR(CheckCacheSeq(record.cache_seq));
  SKIPPY_RETURN_IF_ERROR(cache::FamilyPolicy().ValidateRequest(family_, PayloadKind::kResidentKv));
  const int32_t held = SequenceLength(record.cache_seq);
  if (held != record.n_tokens) {
    return absl::FailedPreconditionError(StrCat("cache sequence ", record.cache_seq, " holds ", held,
                                                " tokens, the record says ", record.n_tokens, " (evicted?)"));
  }
  if (n_tokens <= 0 || n_tokens > record.n_tokens) {
    return absl::InvalidArgumentError(StrCat("cannot restore ", n_tokens, " of ", record.n_tokens, " tokens"));
  }
  if (n_tokens < record.n_tokens && model_->n_swa() > 0 && record.n_tokens > model_->n_swa()) {
    return absl::FailedPreconditionError(
        "a sliding-window cache keeps only the window of its last tokens: an SWA entry longer than the window "
        "serves its exact length");
  }
  SKIPPY_RETURN_IF_ERROR(CheckCut(record.cache_seq, n_tokens));
  llama_memory_t mem = llama_get_memory(context_->raw());
  llama_memory_seq_rm(mem, lane, -1, -1);
  llama_memory_seq_cp(mem, record.cache_seq, lane, 0, n_tokens);
  padded_prefix_[lane] = padded_prefix_[record.cache_seq];
  return absl::OkStatus();
}

StatusOr<std::vector<uint8_t>> Engine::ExportResident(int32_t seq) {
  SKIPPY_RETURN_IF_ERROR(CheckSeq(seq));
  SKIPPY_RETURN_IF_ERROR(cache::FamilyPolicy().ValidateRequest(family_, PayloadKind::kResidentKv));
  if (SequenceLength(seq) == 0) {
    return absl::FailedPreconditionError(StrCat("sequence ", seq, " is empty"));
  }
  const size_t size = llama_state_seq_get_size(context_->raw(), seq);
  std::vector<uint8_t> bytes(size);
  const size_t written = llama_state_seq_get_data(context_->raw(), bytes.data(), bytes.size(), seq);
  if (written == 0 || written > size) {
    return absl::InternalError(StrCat("export of sequence ", seq, " failed: ", TakeLlamaLogTail()));
  }
  bytes.resize(written);
  return bytes;
}

Status Engine::ImportResident(std::span<const uint8_t> bytes, int32_t lane, std::span<const Token> tokens) {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  SKIPPY_RETURN_IF_ERROR(cache::FamilyPolicy().ValidateRequest(family_, PayloadKind::kResidentKv));
  if (bytes.empty()) return absl::InvalidArgumentError("empty resident payload");
  std::vector<uint8_t> padded;
  bool padding = false;
  if (model_->n_swa() > 0) {
    // The window goes back to the cells a recompute leaves it in (see sequence_state.h).
    SKIPPY_ASSIGN_OR_RETURN(std::vector<KvBlockShape> blocks, ParseKvSequenceState(bytes));
    for (const KvBlockShape& b : blocks) padding = padding || b.first_pos > 0;
    if (padding) {
      SKIPPY_ASSIGN_OR_RETURN(padded, PadToPositionZero(bytes, tokens));
      bytes = padded;
    }
  }
  llama_memory_t mem = llama_get_memory(context_->raw());
  llama_memory_seq_rm(mem, lane, -1, -1);
  padded_prefix_[lane] = 0;
  if (llama_state_seq_set_data(context_->raw(), bytes.data(), bytes.size(), lane) == 0) {
    llama_memory_seq_rm(mem, lane, -1, -1);
    return absl::DataLossError(StrCat("llama.cpp rejected the resident payload for lane ", lane, ": ", TakeLlamaLogTail()));
  }
  if (padding) padded_prefix_[lane] = SequenceLength(lane);
  return absl::OkStatus();
}

Status Engine::Truncate(int32_t lane, int32_t n_tokens) {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  if (n_tokens < 0) return absl::InvalidArgumentError("negative length");
  SKIPPY_RETURN_IF_ERROR(CheckCut(lane, n_tokens));
  if (!llama_memory_seq_rm(llama_get_memory(context_->raw()), lane, n_tokens, -1)) {
    return absl::FailedPreconditionError(
        StrCat("lane ", lane, " cannot be cut to ", n_tokens, " tokens (recurrent state cannot be truncated)"));
  }
  if (n_tokens == 0) padded_prefix_[lane] = 0;
  return absl::OkStatus();
}

uint64_t Engine::StateBytes(int32_t seq) const {
  if (!CheckSeq(seq).ok() || SequenceLength(seq) == 0) return 0;
  return llama_state_seq_get_size(context_->raw(), seq);
}

namespace {

llama_state_seq_flags FlagsFor(PayloadKind kind) {
  return kind == PayloadKind::kRecurrentOnly ? LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY : LLAMA_STATE_SEQ_FLAGS_NONE;
}

}  // namespace

StatusOr<std::vector<uint8_t>> Engine::ExportState(int32_t lane, PayloadKind kind) {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  if (kind == PayloadKind::kResidentKv) {
    return absl::InvalidArgumentError("resident-kv is recorded with RecordResident, not exported");
  }
  SKIPPY_RETURN_IF_ERROR(cache::FamilyPolicy().ValidateRequest(family_, kind, /*allow_diagnostic=*/true));
  if (SequenceLength(lane) == 0) return absl::FailedPreconditionError(StrCat("lane ", lane, " is empty"));
  const llama_state_seq_flags flags = FlagsFor(kind);
  const size_t size = llama_state_seq_get_size_ext(context_->raw(), lane, flags);
  std::vector<uint8_t> bytes(size);
  const size_t written = llama_state_seq_get_data_ext(context_->raw(), bytes.data(), bytes.size(), lane, flags);
  if (written == 0 || written > size) {
    return absl::InternalError(StrCat("state export of lane ", lane, " failed: ", TakeLlamaLogTail()));
  }
  bytes.resize(written);
  return bytes;
}

Status Engine::ImportState(std::span<const uint8_t> bytes, int32_t lane, PayloadKind kind) {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  if (kind == PayloadKind::kResidentKv) {
    return absl::InvalidArgumentError("resident-kv is restored with RestoreResident, not imported");
  }
  SKIPPY_RETURN_IF_ERROR(cache::FamilyPolicy().ValidateRequest(family_, kind, /*allow_diagnostic=*/true));
  if (bytes.empty()) return absl::InvalidArgumentError("empty state payload");
  llama_memory_seq_rm(llama_get_memory(context_->raw()), lane, -1, -1);
  padded_prefix_[lane] = 0;
  const size_t read = llama_state_seq_set_data_ext(context_->raw(), bytes.data(), bytes.size(), lane, FlagsFor(kind));
  if (read == 0) {
    llama_memory_seq_rm(llama_get_memory(context_->raw()), lane, -1, -1);
    return absl::DataLossError(StrCat("llama.cpp rejected the state payload for lane ", lane, ": ", TakeLlamaLogTail()));
  }
  return absl::OkStatus();
}

Status Engine::RestoreRecurrentOnto(std::span<const uint8_t> recurrent_part, int32_t lane, int32_t n_tokens) {
  SKIPPY_RETURN_IF_ERROR(CheckLane(lane));
  if (family_.payload != PayloadKind::kKvRecurrent || !facts_.memory_is_hybrid) {
    return absl::FailedPreconditionError("a recurrent-only restore needs a hybrid (attention + recurrent) model");
  }
  // (A hybrid's first position is its recurrent state's, so only the length can be checked.)
  if (n_tokens <= 0 || SequenceLength(lane) < n_tokens) {
    return absl::FailedPreconditionError(
        StrCat("lane ", lane, " holds ", SequenceLength(lane), " tokens, not the ", n_tokens, " to restore onto"));
  }
  if (recurrent_part.size() <= kStateHeaderBytes) return absl::FailedPreconditionError("no recurrent state in the payload");
  const std::span<const uint8_t> part = recurrent_part;
  llama_memory_t mem = llama_get_memory(context_->raw());
  auto fail = [&](Status s) {
    llama_memory_seq_rm(mem, lane, -1, -1);
    padded_prefix_[lane] = 0;
    return s;
  };
  // Replaces the lane's recurrent state (llama.cpp clears it first); the attention KV is untouched.
  const size_t read = llama_state_seq_set_data_ext(context_->raw(), part.data(), part.size(), lane,
                                                   LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  if (read != part.size()) {
    return fail(absl::DataLossError(StrCat("llama.cpp rejected the recurrent state for lane ", lane, ": ", TakeLlamaLogTail())));
  }
  // The recurrent state now ends at n_tokens - 1; cut the attention KV there too.
  if (!llama_memory_seq_rm(mem, lane, n_tokens, -1) || SequenceLength(lane) != n_tokens ||
      llama_memory_seq_pos_max(mem, lane) != n_tokens - 1) {
    return fail(absl::DataLossError(StrCat("the recurrent state in the payload does not end at position ", n_tokens - 1)));
  }
  return absl::OkStatus();
}

}  // namespace skippy::runtime
