// Responses of the generation endpoints, rendered from a job's view: each endpoint's JSON body
// (OpenAI completions and chat completions, llama-server's /completion) and its Server-Sent
// Events. A Completion knows its endpoint and request and renders itself; the HTTP routes only
// pick it and send what it renders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/runtime/chat.h"
#include "skippy/server/request.h"
#include "skippy/server/scheduler.h"

namespace httplib {
class DataSink;
}

namespace skippy::server {

// A chat with tools (a `parser`) answers as llama-server does: the generated text is read back
// into content, reasoning_content and tool_calls (ids made up where the model's format has none,
// one per call for the whole answer), the finish reason is "tool_calls" when the answer called a
// tool and stopped, and a stream sends deltas of that parse as the text grows (ReadReply in
// response.cc says how a cut answer, or one not in the template's format, is read).
class Completion {
 public:
  Completion(Endpoint endpoint, const GenerationRequest& request, std::string model, size_t prompt_tokens,
             std::shared_ptr<const runtime::ReplyParser> parser = nullptr);

  // The non-streaming body of a finished job (without an error).
  nlohmann::json Body(const Job::View& v) const;

  // Streaming: Stream() writes the job's events to `sink` until it is done or the client goes
  // away (then the job is cancelled). Text goes out only up to a complete UTF-8 character, and
  // while stop strings are active the last (longest stop - 1) bytes wait for the end. Returns
  // false when the client went away. Call it again after it returns true with the sink still open.
  struct StreamState {
    size_t sent_tokens = 0;
    size_t sent_bytes = 0;
    bool started = false;
    runtime::ParsedReply reply;         // with a parser: what the deltas sent so far add up to
    std::vector<std::string> tool_ids;  // with a parser: the id of each call
    std::vector<bool> named;            // with a parser: whether each call's id and name went out
    bool parsed_whole = false;          // with a parser: the finished answer was parsed
  };
  bool Stream(Job& job, StreamState& state, httplib::DataSink& sink) const;

 private:
  nlohmann::json Chunk(const std::string& text, const std::vector<runtime::Token>& tokens,
                       const std::optional<std::string>& finish, const std::vector<TokenLogprobs>& probs) const;
  // The chunk that ends a stream: its finish reason, timings and the skippy block.
  nlohmann::json Last(const Job::View& v, const StreamState& state) const;
  // After it with stream_options.include_usage: empty choices and the usage (OpenAI's shape).
  nlohmann::json UsageChunk(const Job::View& v) const;
  // An OpenAI stream event (a chunk): id, object, created and model around `choices`.
  nlohmann::json StreamEvent(nlohmann::json choices) const;
  // Sends what is new in `v`; false when the client went away.
  bool SendNew(const Job::View& v, StreamState& state, httplib::DataSink& sink) const;
  // SendNew with a parser: the deltas from state.reply to the parse of the text up to `upto`.
  bool SendReplyDeltas(const Job::View& v, size_t upto, StreamState& state, std::vector<TokenLogprobs> probs,
                       httplib::DataSink& sink) const;
  // v's finish reason, "tool_calls" where a parsed answer that stopped called a tool.
  std::string FinishReason(const Job::View& v, const runtime::ParsedReply* reply) const;

  Endpoint endpoint_;
  std::string id_;
  int64_t created_;
  std::string model_;
  size_t prompt_tokens_;
  bool return_tokens_;
  bool include_usage_;
  int32_t n_probs_;
  bool chat_logprobs_;
  int32_t top_logprobs_;
  size_t hold_ = 0;  // bytes held back while a stop string may still match
  std::shared_ptr<const runtime::ReplyParser> parser_;  // a chat with tools
};

// The JSON every endpoint uses for bodies and events (no NaN or invalid UTF-8 reaches the client).
std::string Dump(const nlohmann::json& j);

}  // namespace skippy::server
