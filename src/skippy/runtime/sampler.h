// Sampling the next token from last-position logits, and the vocabulary facts generation needs.
//
// Sampler works on a logits vector, not on a llama_context, so the same code samples from freshly
// decoded logits and from a decoded-result cache entry (an exact repeat): for equal logits and an
// equal seed, the sampled sequence is equal.
//   - temperature <= 0: greedy, the lowest token id among the maxima (deterministic, no RNG).
//   - temperature > 0: llama.cpp's sampler chain top_k -> top_p -> min_p -> temperature -> dist(seed).
//   - a logit bias per token comes first of all, as in llama-server's chain.
//   - repetition penalties (llama-server's repeat, frequency and presence penalties over the last
//     penalty_last_n tokens, the prompt's included, as llama-server counts them) come first in
//     either case.
//   - a grammar (GBNF, llama.cpp's grammar format; GrammarFromJsonSchema makes one from a JSON
//     schema) constrains the sampled tokens as llama-server's sampler does: the token the chain
//     samples is kept when the grammar allows it, and otherwise the chain samples again from the
//     tokens the grammar allows. Greedy takes the first allowed maximum either way.
// A Sampler is stateful (its RNG advances per sample, its grammar per token); one per request.
//
// Thread-safety: a Sampler is used by one thread at a time; the free functions read an immutable
// Model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "skippy/common/status.h"
#include "skippy/runtime/model.h"

struct llama_sampler;
struct llama_vocab;

namespace skippy::runtime {

struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 40;      // <= 0: off
  float top_p = 1.0f;      // >= 1: off
  float min_p = 0.0f;      // <= 0: off
  uint32_t seed = 0;
  int32_t penalty_last_n = 64;    // tokens the penalties look back over; 0: off
  float repeat_penalty = 1.0f;    // 1: off; a logit is divided by it (multiplied when negative)
  float frequency_penalty = 0.0f; // subtracted once per occurrence
  float presence_penalty = 0.0f;  // subtracted once for any occurrence
  std::string grammar;            // GBNF with a `root` rule; "": none
  // A lazy grammar (llama.cpp's) applies from the first trigger on: a generated text that matches
  // one of the patterns (regular expressions; the grammar then reads the text from the match), or
  // one of the trigger tokens. At least one trigger when lazy.
  bool grammar_lazy = false;
  std::vector<std::string> grammar_trigger_patterns;
  std::vector<Token> grammar_trigger_tokens;
  // Tokens a grammar that is not lazy reads before the first generated token (a tool-call grammar
  // that spells the generation prompt the chat template wrote).
  std::vector<Token> grammar_prefill;
  // A lazy grammar on a template that thinks: inside a reasoning block (from reasoning_start to one
  // of reasoning_end) the grammar neither applies nor reads, as llama-server's reasoning budget
  // keeps it out; reasoning_prefill are the tokens before the first generated one (the generation
  // prompt, which may open the block).
  std::vector<Token> reasoning_start;
  std::vector<std::vector<Token>> reasoning_end;
  std::vector<Token> reasoning_prefill;
  // Added to a token's logit before any other sampler, as llama-server's logit_bias: in
  // [-100, 100], or -infinity to ban the token. Token ids below the vocabulary size.
  std::vector<std::pair<Token, float>> logit_bias;
  bool penalized() const {
    return penalty_last_n != 0 && (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
  }
};

class Sampler {
 public:
  // InvalidArgument for a negative temperature, top_p outside [0, 1], min_p outside [0, 1], a
  // penalty window outside [0, 2^20], a repeat penalty outside [0.001, 10], a frequency or
  // presence penalty outside [-2, 2], or a logit bias outside [-100, 100] (but -infinity) or on a
  // token id outside [0, n_vocab). `history`: the tokens before the first sampled one (the
  // prompt), which the penalties count; n_vocab: the model's (token ids below it).
  // Without a model, a grammar is InvalidArgument.
  [[nodiscard]] static StatusOr<std::unique_ptr<Sampler>> Create(const SamplingParams& params, int32_t n_vocab = 0,
                                                                 std::span<const Token> history = {});
  // With the model's vocabulary, which a grammar needs (InvalidArgument for one that does not parse).
  [[nodiscard]] static StatusOr<std::unique_ptr<Sampler>> Create(const SamplingParams& params, const Model& model,
                                                                 std::span<const Token> history = {});
  // Create's checks alone (a server runs them before it answers 200; with n_vocab 0, the logit
  // bias's token ids are not checked); the grammar's with a model.
  [[nodiscard]] static Status Validate(const SamplingParams& params, int32_t n_vocab = 0);
  [[nodiscard]] static Status ValidateGrammar(const Model& model, const std::string& grammar);
  // The same for the grammar with its triggers and prefill (a trigger pattern that does not
  // compile, a lazy grammar without triggers, a prefill the grammar refuses).
  [[nodiscard]] static Status ValidateGrammar(const Model& model, const SamplingParams& params);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // REQUIRES: logits non-empty (one value per vocabulary entry). FailedPrecondition when no token
  // is left to sample: the grammar allows none of the vocabulary here (a grammar complete on a
  // vocabulary without an end-of-generation token, or one that needs text no token spells), the
  // logit bias banned every token the grammar allows, or every logit is -infinity or NaN; the
  // penalties and the grammar have then seen no token (the random state may have advanced).
  [[nodiscard]] StatusOr<Token> Sample(std::span<const float> logits);
  bool greedy() const { return chain_ == nullptr; }

 private:
  Sampler() = default;
  static StatusOr<std::unique_ptr<Sampler>> Make(const SamplingParams& params, int32_t n_vocab, const Model* model,
                                                 std::span<const Token> history);
  // Whether the grammar applies to the next token (not inside a reasoning block).
  bool GrammarApplies() const;

  llama_sampler* chain_ = nullptr;      // nullptr for greedy
  llama_sampler* grammar_ = nullptr;    // nullptr without a grammar
  llama_sampler* reasoning_ = nullptr;  // a lazy grammar's reasoning-block tracker, or nullptr
  const llama_vocab* vocab_ = nullptr;  // with reasoning_
};

// A GBNF grammar that accepts exactly the JSON texts a JSON schema describes (llama.cpp's
// converter, as llama-server's json_schema and response_format use it). `schema_json`: the schema
// as JSON text; "{}" accepts any JSON object. InvalidArgument with the converter's reasons for a
// schema it cannot convert.
[[nodiscard]] StatusOr<std::string> GrammarFromJsonSchema(const std::string& schema_json);
// The bounds GrammarFromJsonSchema puts on a schema before llama.cpp's converter sees it (64 KiB,
// 64 $ref), for schemas that reach the converter another way (a tool's parameters).
[[nodiscard]] Status CheckJsonSchemaBounds(std::string_view schema_json);

// True for end-of-generation tokens (EOS, EOT, ...). False for ids outside the vocabulary.
bool IsEndOfGeneration(const Model& model, Token token);
// The text of one token (special tokens rendered as text when `special`). InvalidArgument for an
// id outside the vocabulary.
[[nodiscard]] StatusOr<std::string> TokenPiece(const Model& model, Token token, bool special = false);

}  // namespace skippy::runtime
