// Job: one generation request between the HTTP thread that submitted it and the engine thread
// that runs it. The handler thread waits on it (Wait/WaitFor) or cancels it (a client that went
// away); the engine thread appends tokens and text, then marks it done with an error or a finish
// reason. Everything the handler reads is a snapshot taken under the job's lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "skippy/runtime/model.h"
#include "skippy/server/api_error.h"
#include "skippy/server/request.h"

namespace skippy::server {

using Clock = std::chrono::steady_clock;

struct JobTimings {
  size_t cache_n = 0;       // prompt tokens restored from the cache
  size_t prompt_n = 0;      // prompt tokens prefilled
  double prompt_ms = 0;     // lane start to the first token's logits
  size_t predicted_n = 0;
  double predicted_ms = 0;
  double queue_ms = 0;      // arrival to lane start
  double prefix_wait_ms = 0;  // part of queue_ms spent in a lane, waiting for another lane's prefill of a shared prefix
  double ttft_ms = 0;       // arrival to the first generated token (server side)
  double restore_ms = 0;    // the cache lookup and restore (import, lane cut), part of prompt_ms
  double record_ms = 0;     // records taken during prefill (before the first token), part of prompt_ms
  bool decoded_result_hit = false;
  std::string cache_payload;     // payload restored from, "" on a miss
  std::string cache_tier;        // "lane", "memory" or "disk" on a hit
  std::string cache_miss_reason; // "" on a hit
};

// One generated token's log-probability and the most likely alternatives (GenerationRequest::n_probs),
// from the full-vocabulary log-softmax of the logits it was sampled from.
struct TokenLogprobs {
  struct Candidate {
    runtime::Token id = 0;
    std::string piece;
    double logprob = 0;
  };
  Candidate chosen;
  std::vector<Candidate> top;  // n_probs most likely, descending (ties: lower id first)
};

class Job {
 public:
  Job(GenerationRequest request, PreparedPrompt prompt, std::string tenant_namespace, int64_t max_tokens)
      : request_(std::move(request)), prompt_(std::move(prompt)), namespace_(std::move(tenant_namespace)),
        max_tokens_(max_tokens), arrival_(Clock::now()) {}

  const GenerationRequest& request() const { return request_; }
  const PreparedPrompt& prompt() const { return prompt_; }
  const std::string& tenant_namespace() const { return namespace_; }
  int64_t max_tokens() const { return max_tokens_; }
  Clock::time_point arrival() const { return arrival_; }

  // What the handler reads, under the job's lock (WaitFor copies it field by field: a new field
  // goes there too).
  struct View {
    std::vector<runtime::Token> tokens;  // generated ids
    std::vector<TokenLogprobs> logprobs; // one per token from logprobs_from when request().n_probs > 0
    size_t logprobs_from = 0;            // the token logprobs[0] belongs to (WaitFor: the tokens asked past)
    std::string text;                    // generated text (stop string removed)
    bool done = false;
    std::optional<ApiError> error;
    std::string finish_reason;           // "stop" or "length"
    JobTimings timings;
  };
  // The generated text so far (stop string removed).
  std::string text() const;
  // Blocks until the job has more than `have_tokens` tokens or is done, or `timeout` passes; the
  // view's log-probabilities start at token have_tokens (View::logprobs_from).
  View WaitFor(size_t have_tokens, std::chrono::milliseconds timeout);
  View Wait();
  // Whether the job is done, waiting at most `timeout` for it.
  bool WaitDone(std::chrono::milliseconds timeout);

  // Called once with the final view when the job finishes, on the thread that finishes it and
  // under the job's lock (keep it short; never call back into the job). Set before the job is
  // submitted.
  void OnDone(std::function<void(const View&)> f) { on_done_ = std::move(f); }

  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Engine side.
  void Append(runtime::Token token, const std::string& piece, bool* stop_hit,
              std::optional<TokenLogprobs> logprobs = std::nullopt);
  void Finish(std::string finish_reason, std::optional<ApiError> error, const JobTimings& timings);
  void SetTimings(const JobTimings& t);

 private:
  View Snapshot() const;

  GenerationRequest request_;
  PreparedPrompt prompt_;
  std::string namespace_;
  int64_t max_tokens_;
  Clock::time_point arrival_;
  std::atomic<bool> cancelled_{false};
  std::function<void(const View&)> on_done_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  View view_ ABSL_GUARDED_BY(mu_);
};

// Log-softmax in double over the whole vocabulary (so equal logits give equal numbers): the
// chosen token's log-probability and the n most likely tokens' (ties: lower id first).
TokenLogprobs Logprobs(const runtime::Model& model, const std::vector<float>& logits, runtime::Token chosen, int32_t n);

}  // namespace skippy::server
