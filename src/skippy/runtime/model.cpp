#include "skippy/runtime/model.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "skippy/common/strings.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "skippy/runtime/llama_backend.h"

namespace skippy::runtime {

StatusOr<GgufSummary> InspectGgufFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return absl::NotFoundError(StrCat("no model file at ", path));
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(StrCat("cannot stat ", path, ": ", ec.message()));
  {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) return absl::NotFoundError(StrCat("cannot open ", path));
    char magic[4] = {};
    if (std::fread(magic, 1, 4, f.get()) != 4 || std::memcmp(magic, "GGUF", 4) != 0) {
      return absl::InvalidArgumentError(StrCat(path, " is not a GGUF file (bad magic)"));
    }
  }
  EnsureLlamaBackend();
  gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/nullptr};
  std::unique_ptr<gguf_context, void (*)(gguf_context*)> ctx(gguf_init_from_file(path.c_str(), params), &gguf_free);
  if (!ctx) {
    return absl::DataLossError(StrCat(path, " is a corrupt or truncated GGUF (header unreadable): ",
                                            TakeLlamaLogTail()));
  }
  const uint64_t data_offset = gguf_get_data_offset(ctx.get());
  uint64_t end = data_offset;
  for (int64_t i = 0; i < gguf_get_n_tensors(ctx.get()); ++i) {
    end = std::max<uint64_t>(end, data_offset + gguf_get_tensor_offset(ctx.get(), i) + gguf_get_tensor_size(ctx.get(), i));
  }
  if (end > size) {
    return absl::DataLossError(StrCat(path, " is truncated: tensor data needs ", end, " bytes, file has ", size));
  }
  GgufSummary summary;
  summary.file_bytes = size;
  const int64_t arch_key = gguf_find_key(ctx.get(), "general.architecture");
  if (arch_key >= 0 && gguf_get_kv_type(ctx.get(), arch_key) == GGUF_TYPE_STRING) {
    summary.arch = gguf_get_val_str(ctx.get(), arch_key);
  }
  for (int64_t i = 0; i < gguf_get_n_tensors(ctx.get()); ++i) summary.tensor_names.emplace_back(gguf_get_tensor_name(ctx.get(), i));
  return summary;
}

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path, const ModelOptions& options) {
  SKIPPY_ASSIGN_OR_RETURN(GgufSummary summary, InspectGgufFile(path));
  EnsureLlamaBackend();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = options.n_gpu_layers;
  mp.load_mode = options.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
  llama_model* m = llama_model_load_from_file(path.c_str(), mp);
  if (m == nullptr) {
    return absl::InvalidArgumentError(StrCat("llama.cpp cannot load ", path, ": ", TakeLlamaLogTail()));
  }
  return std::unique_ptr<Model>(new Model(path, m, std::move(summary)));
}

Model::~Model() { llama_model_free(model_); }

std::optional<std::string> Model::MetaString(const std::string& key) const {
  char buf[512];
  const int32_t n = llama_model_meta_val_str(model_, key.c_str(), buf, sizeof buf);
  if (n < 0) return std::nullopt;
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(n) + 1, '\0');
  llama_model_meta_val_str(model_, key.c_str(), big.data(), big.size());
  big.resize(static_cast<size_t>(n));
  return big;
}

std::string Model::arch() const { return MetaString("general.architecture").value_or(""); }
int32_t Model::n_vocab() const { return llama_vocab_n_tokens(llama_model_get_vocab(model_)); }
int32_t Model::n_ctx_train() const { return llama_model_n_ctx_train(model_); }
int32_t Model::n_layer() const { return llama_model_n_layer(model_); }
uint64_t Model::n_params() const { return llama_model_n_params(model_); }
std::string Model::WeightFormat() const {
  char buf[256] = {};
  llama_model_desc(model_, buf, sizeof buf);
  const std::string desc = buf;
  const size_t cut = desc.find(' ', desc.find(' ') + 1);
  return cut == std::string::npos ? desc : desc.substr(cut + 1);
}
bool Model::is_recurrent() const { return llama_model_is_recurrent(model_); }
bool Model::is_hybrid() const { return llama_model_is_hybrid(model_); }
int32_t Model::n_swa() const { return llama_model_n_swa(model_); }

namespace {

StatusOr<ggml_type> ParseKvType(const std::string& name) {
  for (ggml_type t : {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                      GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL}) {
    if (name == ggml_type_name(t)) return t;
  }
  return absl::InvalidArgumentError(StrCat("unknown KV cache type '", name, "' (f32, f16, bf16, q8_0, q4_0, ...)"));
}

// ContextOptions::graph_count's eval callback: every graph of a decoder ends in one
// "result_output" node (the logits); asked about each node before it runs, it needs none.
bool CountGraphs(ggml_tensor* t, bool ask, void* user_data) {
  if (ask && std::strcmp(t->name, "result_output") == 0) {
    static_cast<std::atomic<uint64_t>*>(user_data)->fetch_add(1, std::memory_order_relaxed);
  }
  return !ask;
}

}  // namespace

StatusOr<std::vector<Token>> Model::Tokenize(std::string_view text, bool add_special, bool parse_special) const {
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  if (text.size() > static_cast<size_t>(INT32_MAX / 2)) return absl::InvalidArgumentError("text too long to tokenize");
  std::vector<Token> out(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                             static_cast<int32_t>(out.size()), add_special, parse_special);
  if (n < 0) {
    out.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                       static_cast<int32_t>(out.size()), add_special, parse_special);
  }
  if (n < 0) return absl::InvalidArgumentError("tokenization failed");
  out.resize(static_cast<size_t>(n));
  return out;
}

std::optional<size_t> Model::MaxBytesPerToken() const {
  std::call_once(max_bytes_once_, [this] {
    const llama_vocab* vocab = llama_model_get_vocab(model_);
    const enum llama_vocab_type type = llama_vocab_type(vocab);
    if (type != LLAMA_VOCAB_TYPE_BPE && type != LLAMA_VOCAB_TYPE_SPM) return;
    size_t most = 1;
    std::vector<char> buf(256);
    for (Token t = 0; t < llama_vocab_n_tokens(vocab); ++t) {
      int32_t n = llama_token_to_piece(vocab, t, buf.data(), static_cast<int32_t>(buf.size()), 0, /*special=*/true);
      if (n < 0) {
        buf.resize(static_cast<size_t>(-n));
        n = llama_token_to_piece(vocab, t, buf.data(), static_cast<int32_t>(buf.size()), 0, true);
      }
      if (n > 0) most = std::max(most, static_cast<size_t>(n));
    }
    max_bytes_per_token_ = most;
  });
  return max_bytes_per_token_;
}

Status Model::ValidateTokens(std::span<const Token> tokens) const {
  const int32_t nv = n_vocab();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= nv) {
      return absl::InvalidArgumentError(
          StrCat("token id ", tokens[i], " at index ", i, " is outside the vocabulary [0, ", nv, ")"));
    }
  }
  return absl::OkStatus();
}

StatusOr<std::string> Model::Detokenize(std::span<const Token> tokens, bool remove_special) const {
  SKIPPY_RETURN_IF_ERROR(ValidateTokens(tokens));
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  std::string out(tokens.size() * 8 + 16, '\0');
  int32_t n = llama_detokenize(vocab, tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                               static_cast<int32_t>(out.size()), remove_special, /*unparse_special=*/true);
  if (n < 0) {
    out.resize(static_cast<size_t>(-n));
    n = llama_detokenize(vocab, tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                         static_cast<int32_t>(out.size()), remove_special, true);
  }
  if (n < 0) return absl::InternalError("detokenization failed");
  out.resize(static_cast<size_t>(n));
  return out;
}

StatusOr<std::unique_ptr<Context>> Context::Create(const Model& model, const ContextOptions& options) {
  if (options.n_ctx == 0 || options.n_batch == 0 || options.n_ubatch == 0 || options.n_seq_max == 0) {
    return absl::InvalidArgumentError("context sizes must be positive");
  }
  // ggml sizes its threadpool from it: 0 has no worker to run a graph, a negative count wraps.
  if (options.n_threads < 1 || options.n_threads > ContextOptions::kMaxThreads) {
    return absl::InvalidArgumentError(
        StrCat("threads must lie in [1, ", ContextOptions::kMaxThreads, "], not ", options.n_threads));
  }
  SKIPPY_ASSIGN_OR_RETURN(ggml_type type_k, ParseKvType(options.type_k));
  SKIPPY_ASSIGN_OR_RETURN(ggml_type type_v, ParseKvType(options.type_v));
  if (!options.flash_attn && ggml_is_quantized(type_v)) {
    return absl::InvalidArgumentError("a quantized V cache needs flash attention on");
  }
  llama_context_params cp = llama_context_default_params();
  cp.type_k = type_k;
  cp.type_v = type_v;
  cp.n_ctx = options.n_ctx;
  cp.n_batch = options.n_batch;
  cp.n_ubatch = options.n_ubatch;
  cp.n_seq_max = options.n_seq_max;
  cp.n_threads = options.n_threads;
  cp.n_threads_batch = options.n_threads;
  cp.flash_attn_type = options.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.kv_unified = options.kv_unified;
  cp.swa_full = options.swa_full;
  cp.no_perf = true;
  if (options.graph_count != nullptr) {
    cp.cb_eval = CountGraphs;
    cp.cb_eval_user_data = options.graph_count;
  }
  llama_context* ctx = llama_init_from_model(model.raw(), cp);
  if (ctx == nullptr) {
    return absl::InvalidArgumentError(StrCat("llama.cpp cannot create a context: ", TakeLlamaLogTail()));
  }
  ggml_threadpool_params tpp = ggml_threadpool_params_default(options.n_threads);
  tpp.poll = static_cast<uint32_t>(std::clamp(options.poll, 0, 100));
  ggml_threadpool* threadpool = ggml_threadpool_new(&tpp);
  if (threadpool == nullptr) {
    llama_free(ctx);
    return absl::InternalError(StrCat("cannot create a CPU threadpool of ", options.n_threads, " threads"));
  }
  llama_attach_threadpool(ctx, threadpool, threadpool);
  // llama.cpp may adjust sizes (n_batch is clamped to n_ctx, n_ctx is padded): record what it uses.
  ContextOptions effective = options;
  effective.n_ctx = llama_n_ctx(ctx);
  effective.n_batch = llama_n_batch(ctx);
  effective.n_ubatch = llama_n_ubatch(ctx);
  return std::unique_ptr<Context>(new Context(model, effective, ctx, threadpool));
}

Context::~Context() {
  llama_free(ctx_);
  ggml_threadpool_free(threadpool_);
}

void Context::ClearSequence(int32_t seq) { llama_memory_seq_rm(llama_get_memory(ctx_), seq, -1, -1); }

StatusOr<std::vector<float>> Context::Decode(std::span<const Token> tokens, int32_t pos0, int32_t seq) {
  SKIPPY_RETURN_IF_ERROR(Run(tokens, pos0, seq, /*last_logits=*/true));
  const float* logits = llama_get_logits_ith(ctx_, -1);
  if (logits == nullptr) return absl::InternalError("llama.cpp returned no logits");
  return std::vector<float>(logits, logits + model_.n_vocab());
}

Status Context::Prefill(std::span<const Token> tokens, int32_t pos0, int32_t seq) {
  return Run(tokens, pos0, seq, /*last_logits=*/false);
}

uint32_t Context::SequenceCapacity() const { return llama_n_ctx_seq(ctx_); }

Status Context::CheckSeq(int32_t seq) const {
  if (seq < 0 || static_cast<uint32_t>(seq) >= options_.n_seq_max) {
    return absl::InvalidArgumentError(StrCat("sequence id ", seq, " outside [0, ", options_.n_seq_max, ")"));
  }
  return absl::OkStatus();
}

Status Context::Submit(std::span<const Row> rows) {
  llama_batch batch = llama_batch_init(static_cast<int32_t>(rows.size()), 0, 1);
  std::unique_ptr<llama_batch, void (*)(llama_batch*)> guard(&batch, [](llama_batch* b) { llama_batch_free(*b); });
  batch.n_tokens = static_cast<int32_t>(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    batch.token[i] = rows[i].token;
    batch.pos[i] = rows[i].pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = rows[i].seq;
    batch.logits[i] = rows[i].output ? 1 : 0;
  }
  if (const int32_t rc = llama_decode(ctx_, batch); rc != 0) {
    return absl::InternalError(StrCat("llama_decode failed (", rc, "): ", TakeLlamaLogTail()));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<std::vector<float>>> Context::DecodeRows(std::span<const Row> rows) {
  if (rows.empty()) return absl::InvalidArgumentError("nothing to decode: no rows");
  if (rows.size() > llama_n_batch(ctx_)) {
    return absl::InvalidArgumentError(StrCat(rows.size(), " rows exceed the batch of ", llama_n_batch(ctx_)));
  }
  const uint32_t capacity = SequenceCapacity();
  for (const Row& r : rows) {
    SKIPPY_RETURN_IF_ERROR(model_.ValidateTokens(std::span(&r.token, 1)));
    SKIPPY_RETURN_IF_ERROR(CheckSeq(r.seq));
    if (r.pos < 0 || static_cast<uint32_t>(r.pos) >= capacity) {
      return absl::InvalidArgumentError(StrCat("position ", r.pos, " outside a sequence's ", capacity, " cells"));
    }
  }
  SKIPPY_RETURN_IF_ERROR(Submit(rows));
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].output) continue;
    const float* logits = llama_get_logits_ith(ctx_, static_cast<int32_t>(i));
    if (logits == nullptr) return absl::InternalError("llama.cpp returned no logits");
    out.emplace_back(logits, logits + model_.n_vocab());
  }
  return out;
}

Status Context::Run(std::span<const Token> tokens, int32_t pos0, int32_t seq, bool last_logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("nothing to decode: empty token list");
  SKIPPY_RETURN_IF_ERROR(model_.ValidateTokens(tokens));
  const uint32_t n_ctx = llama_n_ctx(ctx_);
  if (pos0 < 0 || static_cast<uint64_t>(pos0) + tokens.size() > n_ctx) {
    return absl::InvalidArgumentError(StrCat("positions ", pos0, "..", pos0 + tokens.size(),
                                                   " do not fit the context of ", n_ctx, " tokens"));
  }
  SKIPPY_RETURN_IF_ERROR(CheckSeq(seq));
  const size_t chunk = llama_n_batch(ctx_);
  std::vector<Row> rows;
  rows.reserve(std::min(chunk, tokens.size()));
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    const size_t n = std::min(chunk, tokens.size() - start);
    rows.clear();
    for (size_t i = 0; i < n; ++i) {
      rows.push_back({seq, pos0 + static_cast<int32_t>(start + i), tokens[start + i],
                      last_logits && start + i + 1 == tokens.size()});
    }
    SKIPPY_RETURN_IF_ERROR(Submit(rows));
  }
  return absl::OkStatus();
}

}  // namespace skippy::runtime
