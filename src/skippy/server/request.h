// Parsing and validating generation requests (the JSON bodies of /v1/completions,
// /v1/chat/completions and llama-server's /completion) before anything touches the engine.
//
// Field policy (documented in the README):
//   - Unknown fields are rejected (400, code "unknown_field"): a typo such as "max_token" must not
//     silently run with defaults. Fields OpenAI clients commonly send that skippy does not
//     implement are accepted only with their neutral value (n = 1,
//     logprobs false/null, echo false, suffix null/""; in a message, annotations empty); other
//     values are 400 "unsupported_field".
//   - Function calling (chat): `tools` (function tools), `tool_choice` ("none", "auto",
//     "required"; naming one function is 400 "unsupported_field") and `parallel_tool_calls`; an
//     assistant message's `tool_calls` (arguments within max_json_depth) and `reasoning_content`,
//     and a tool message's `tool_call_id` and `name`. The tools are rendered by the chat template
//     and constrain the answer with the grammar llama.cpp derives for the template (PreparePrompt,
//     ApplyToolCalling); tools that may be called beside a grammar or a schema are 400.
//   - Constrained output: `grammar` (GBNF) or `json_schema` on every endpoint, and on chat
//     `response_format` {"type": "text" | "json_object" | "json_schema"}, one of them at most,
//     become SamplingParams::grammar; a schema that does not convert is a 400 here, a grammar that
//     does not parse a 400 from PreparePrompt (which has the vocabulary).
//   - A JSON null counts as absent, at the top level and in a message.
//   - Types are strict: "max_tokens": "8" is 400.
//   - max_tokens / n_predict: 0 evaluates the prompt only, n_predict -1 (or absent) means the
//     server default; any other negative value is 400. The bound against the context is checked
//     after tokenization (CheckBudget), before the request is queued.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"
#include "skippy/runtime/chat.h"
#include "skippy/runtime/model.h"
#include "skippy/runtime/sampler.h"

namespace skippy::server {

enum class Endpoint { kLlamaCompletion, kCompletions, kChatCompletions };

// The smallest temperature other than 0 (greedy) a request may ask for: below it a logit divided
// by the temperature can overflow a float, and llama.cpp's sampler draws from NaN probabilities.
inline constexpr double kMinTemperature = 1e-6;

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Exactly one prompt form is set: text, token ids, or chat messages.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<runtime::Token>> prompt_tokens;
  std::vector<runtime::ChatMessage> messages;
  runtime::ChatTools tools;  // chat: the functions the model may call
  int64_t max_tokens = -1;  // -1: server default
  runtime::SamplingParams sampling;
  std::string grammar_field;  // the field sampling.grammar came from ("grammar", "json_schema" ...)
  bool seed_given = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::vector<std::string> stop;
  std::string cache_salt;      // tenant namespace inside the API key's namespace
  bool ignore_eos = false;
  bool return_tokens = false;  // /completion: include generated token ids ("tokens")
  // /completion (llama-server's n_probs): for each generated token, its log-probability and the
  // n_probs most likely tokens' ("completion_probabilities"), from the full-vocabulary softmax of
  // the logits it was sampled from. 0..kMaxProbs; not with stream.
  static constexpr int64_t kMaxProbs = 20;
  int32_t n_probs = 0;
  // /v1/chat/completions "logprobs": true: choices[0].logprobs.content, top_logprobs alternatives
  // each (n_probs is then max(1, top_logprobs)).
  bool chat_logprobs = false;
  int32_t top_logprobs = 0;
};

// Bounds on a request's shape, checked before the work they bound (skippy-server flags).
struct RequestLimits {
  size_t max_json_depth = 32;  // nesting of arrays and objects, checked before parsing
  size_t max_messages = 256;   // chat messages, checked before rendering
};

// InvalidArgument (API code "json_too_deep") for a body nested deeper than the limit; a linear
// scan of the raw bytes, so a hostile body never reaches the parser's recursion.
[[nodiscard]] Status CheckJsonShape(std::string_view body, const RequestLimits& limits);

// InvalidArgument with a message that names the field ("too_many_messages" past the limit).
// `body` must be a parsed JSON value.
[[nodiscard]] StatusOr<GenerationRequest> ParseGenerationRequest(Endpoint endpoint, const nlohmann::json& body,
                                                                 const RequestLimits& limits = {});

struct PreparedPrompt {
  std::vector<runtime::Token> tokens;
  // Token offsets where chat messages end (empty for a raw prompt): the record plan's turn
  // boundaries and the segments of the prompt's batch classes (cache::BatchClasses).
  std::vector<size_t> message_boundaries;
  // A chat with tools: how its answer is sampled (ApplyToolCalling) and read back.
  std::optional<runtime::ToolCalling> tool_calling;
  std::shared_ptr<const runtime::ReplyParser> reply_parser;
};

// llama-server's POST /apply-template: {"messages": [...]} -> the prompt text the chat template
// renders (with the assistant header), as /v1/chat/completions would tokenize it.
[[nodiscard]] StatusOr<std::string> ApplyTemplate(const runtime::Model& model, const nlohmann::json& body,
                                                 const RequestLimits& limits = {});

// Tokenizes (rendering chat messages with the model's template), validates token ids and the
// grammar against the model's vocabulary.
// InvalidArgument for an empty prompt or an id outside the vocabulary; with max_prompt_tokens > 0,
// InvalidArgument "context_length_exceeded" for a text too long to hold that many tokens
// (runtime::Model::MaxBytesPerToken), before it is tokenized: a long body then costs no
// tokenizer time or memory.
[[nodiscard]] StatusOr<PreparedPrompt> PreparePrompt(const runtime::Model& model, const GenerationRequest& request,
                                                     size_t max_prompt_tokens = 0);

// A chat with tools runs with the tools' grammar (its triggers and prefill) and the template's stop
// strings added to the request's.
void ApplyToolCalling(const runtime::ToolCalling& calling, GenerationRequest& request);

// The limits a tokenized request is checked against (ServerOptions).
struct Budget {
  int64_t context = 2048;            // prompt + generated tokens per request
  int64_t max_prompt_tokens = 0;     // 0: the context
  int64_t max_tokens_limit = 0;      // 0: the context
  int64_t default_max_tokens = -1;   // when the request gives none; -1: what the context leaves
  // The most prompt tokens a request may have.
  int64_t prompt_limit() const { return max_prompt_tokens > 0 ? std::min(max_prompt_tokens, context) : context; }
};

// The number of tokens to generate for a prompt of `prompt_tokens` tokens and a request's
// max_tokens (-1: the default). InvalidArgument with API code "context_length_exceeded" when the
// prompt, or the prompt plus max_tokens, does not fit; "invalid_max_tokens" past the limit.
[[nodiscard]] StatusOr<int64_t> CheckBudget(const Budget& budget, size_t prompt_tokens, int64_t max_tokens);

}  // namespace skippy::server
