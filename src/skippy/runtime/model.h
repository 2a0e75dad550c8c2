// Loading GGUF models and running them: the runtime adapter's thin, checked layer over llama.cpp.
//
// Model owns a llama_model; Context owns a llama_context created from a Model (the Model must
// outlive it). Every entry point validates its input first and turns llama.cpp failures into a
// Status, so bad input (a truncated file, a non-GGUF file, an out-of-range token, a prompt longer
// than the context) never reaches a llama.cpp abort.
//
// Thread-safety: a Model is immutable after Load and may be shared; a Context is used by one thread
// at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "skippy/common/status.h"

struct llama_model;
struct common_chat_templates;
struct llama_context;
struct ggml_threadpool;

namespace skippy::runtime {

using Token = int32_t;

// What a GGUF file says about itself, read without loading tensor data.
struct GgufSummary {
  std::string arch;                        // general.architecture ("" if absent)
  std::vector<std::string> tensor_names;
  uint64_t file_bytes = 0;
};

// Checks that `path` is a readable, complete GGUF file: magic, parsable header, and tensor data
// inside the file. InvalidArgument for a file that is not GGUF, DataLoss for a truncated or
// corrupt one, NotFound when it does not exist.
StatusOr<GgufSummary> InspectGgufFile(const std::string& path);
inline Status CheckGgufFile(const std::string& path) { return InspectGgufFile(path).status(); }

struct ModelOptions {
  int n_gpu_layers = 0;
  bool use_mmap = true;
};

class Model {
 public:
  [[nodiscard]] static StatusOr<std::unique_ptr<Model>> Load(const std::string& path, const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& path() const { return path_; }
  std::string arch() const;
  int32_t n_vocab() const;
  int32_t n_ctx_train() const;
  int32_t n_layer() const;
  uint64_t n_params() const;
  // The weight format as llama.cpp names it ("Q4_1", "Q4_K - Medium"): its one-line model
  // description is "<arch> <size class> <format>".
  std::string WeightFormat() const;
  // Tensor names as stored in the GGUF (the family policy looks for recurrent markers).
  const std::vector<std::string>& tensor_names() const { return summary_.tensor_names; }
  bool is_recurrent() const;
  bool is_hybrid() const;
  int32_t n_swa() const;
  // A string metadata value, if present.
  std::optional<std::string> MetaString(const std::string& key) const;

  // InvalidArgument if the text cannot be tokenized.
  StatusOr<std::vector<Token>> Tokenize(std::string_view text, bool add_special, bool parse_special = false) const;
  // InvalidArgument for token ids outside [0, n_vocab). `remove_special` drops a leading BOS and a
  // trailing EOS (what a server adds back when it tokenizes the text).
  StatusOr<std::string> Detokenize(std::span<const Token> tokens, bool remove_special = false) const;
  Status ValidateTokens(std::span<const Token> tokens) const;
  // The most text bytes one token stands for, for byte-pair and SentencePiece vocabularies, whose
  // tokens' pieces add up to a text's bytes or more, so a text of more than n times this many
  // bytes has more than n tokens and can be refused before it is tokenized. Two cases drop bytes
  // and break the bound: whitespace after special tokens that llama.cpp strips (Phi-3's), and
  // bytes a BPE vocabulary without byte tokens has no token for; a text refused that way is
  // longer than n times the longest piece and mostly bytes the tokenizer drops. nullopt for
  // tokenizers that normalize their input (WordPiece, Unigram and the others). Computed on first
  // use from every token's piece, with special tokens as text. Thread-safe.
  std::optional<size_t> MaxBytesPerToken() const;

  llama_model* raw() const { return model_; }
  // The chat templates llama-server renders this model's chat requests with (its GGUF template run
  // by llama.cpp's Jinja engine, or llama.cpp's default when it has none), built on first use
  // (chat.cpp); null when the template does not compile. Thread-safe.
  const common_chat_templates* ChatTemplates() const;

 private:
  Model(std::string path, llama_model* model, GgufSummary summary)
      : path_(std::move(path)), model_(model), summary_(std::move(summary)) {}
  std::string path_;
  llama_model* model_;
  GgufSummary summary_;
  mutable std::once_flag max_bytes_once_;
  mutable std::optional<size_t> max_bytes_per_token_;
  mutable std::once_flag chat_once_;
  mutable std::shared_ptr<common_chat_templates> chat_templates_;
};

struct ContextOptions {
  static constexpr int kMaxThreads = 1024;  // as skippy-server's -t
  uint32_t n_ctx = 4096;
  uint32_t n_batch = 512;
  uint32_t n_ubatch = 512;
  int n_threads = 2;  // [1, kMaxThreads]
  bool flash_attn = false;  // explicit: never "auto", so V layout is the same in every context
  uint32_t n_seq_max = 1;
  std::string type_k = "f16";  // KV cache element types (f32, f16, bf16, q8_0, q4_0, ...)
  std::string type_v = "f16";
  bool kv_unified = true;
  bool swa_full = false;
  // Persistent CPU threadpool with hybrid polling (llama-server's default, --poll 50): without it
  // every decode starts and joins its worker threads, which costs about a millisecond per token.
  int poll = 50;
  // When set, incremented once for every decoder graph llama.cpp computes in this context (one per
  // ubatch of a llama_decode), through its eval callback: it counts graphs holding the node named
  // "result_output" (the logits, in every architecture of the family table), so a K-shift or other
  // memory update graph is not counted. The caller keeps it alive while the context lives. For
  // tests and diagnostics: it asks to see no tensor, so each graph is still computed in one piece.
  std::atomic<uint64_t>* graph_count = nullptr;
};

class Context {
 public:
  [[nodiscard]] static StatusOr<std::unique_ptr<Context>> Create(const Model& model, const ContextOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Decodes `tokens` into sequence `seq` at positions [pos0, pos0 + size) in chunks of n_batch and
  // returns the logits of the last token. REQUIRES: tokens non-empty and valid for the model,
  // pos0 + size <= n_ctx (InvalidArgument otherwise).
  StatusOr<std::vector<float>> Decode(std::span<const Token> tokens, int32_t pos0, int32_t seq = 0);
  // The same decode with no output row: llama.cpp skips the output projection (a vocabulary-sized
  // matrix-vector product, the costliest part of a short batch for large vocabularies). The KV and
  // recurrent state it leaves are those Decode leaves (outputs only select rows after the last
  // layer's cache writes). For the chunks of a prompt whose logits nobody reads.
  Status Prefill(std::span<const Token> tokens, int32_t pos0, int32_t seq = 0);
  // One row of DecodeRows: `token` into sequence `seq` at `pos`; `output` asks for its logits.
  struct Row {
    int32_t seq = 0;
    int32_t pos = 0;
    Token token = 0;
    bool output = false;
  };
  // Decodes `rows` (1..n_batch of them, any sequences) in one llama_decode and returns the logits
  // of the output rows, in order. REQUIRES: valid tokens and sequence ids, each position below the
  // sequence's share of the context (llama_n_ctx_seq); InvalidArgument otherwise.
  StatusOr<std::vector<std::vector<float>>> DecodeRows(std::span<const Row> rows);
  // Cells one sequence can hold (llama_n_ctx_seq: n_ctx, or n_ctx / n_seq_max with one KV stream
  // per sequence).
  uint32_t SequenceCapacity() const;
  // Removes every cell of `seq`.
  void ClearSequence(int32_t seq);

  // The effective settings (llama.cpp may clamp n_batch to n_ctx and pad n_ctx).
  const ContextOptions& options() const { return options_; }
  const Model& model() const { return model_; }
  llama_context* raw() const { return ctx_; }

 private:
  Context(const Model& model, ContextOptions options, llama_context* ctx, ggml_threadpool* threadpool)
      : model_(model), options_(options), ctx_(ctx), threadpool_(threadpool) {}
  // Decode and Prefill: validates, then runs llama_decode per n_batch chunk; `last_logits` asks for
  // the last token's output row.
  Status Run(std::span<const Token> tokens, int32_t pos0, int32_t seq, bool last_logits);
  Status CheckSeq(int32_t seq) const;
  // One llama_decode of validated rows (at most n_batch).
  Status Submit(std::span<const Row> rows);
  const Model& model_;
  ContextOptions options_;
  llama_context* ctx_;
  ggml_threadpool* threadpool_;  // persistent worker threads, as llama-server attaches them
};

}  // namespace skippy::runtime
