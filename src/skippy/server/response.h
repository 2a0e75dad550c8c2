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
#include "skippy/server/request.h"
#include "skippy/server/scheduler.h"

namespace httplib {
class DataSink;
}

namespace skippy::server {

class Completion {
 public:
  Completion(Endpoint endpoint, const GenerationRequest& request, std::string model, size_t prompt_tokens);

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
  };
  bool Stream(Job& job, StreamState& state, httplib::DataSink& sink) const;

 private:
  nlohmann::json Chunk(const std::string& text, const std::vector<runtime::Token>& tokens,
                       const std::optional<std::string>& finish, const std::vector<TokenLogprobs>& probs) const;
  // The chunk that ends a stream: its finish reason, timings and the skippy block.
  nlohmann::json Last(const Job::View& v) const;
  // After it with stream_options.include_usage: empty choices and the usage (OpenAI's shape).
  nlohmann::json UsageChunk(const Job::View& v) const;
  // An OpenAI stream event (a chunk): id, object, created and model around `choices`.
  nlohmann::json StreamEvent(nlohmann::json choices) const;
  // Sends what is new in `v`; false when the client went away.
  bool SendNew(const Job::View& v, StreamState& state, httplib::DataSink& sink) const;

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
};

// The JSON every endpoint uses for bodies and events (no NaN or invalid UTF-8 reaches the client).
std::string Dump(const nlohmann::json& j);

}  // namespace skippy::server
