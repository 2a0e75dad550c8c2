// An HTTP model server under test -- llama-server (the baseline) or skippy-server -- run as a child
// process on a free loopback port with matched settings.
//
// ModelServer::Start launches the binary, polls /health until it answers 200, and fails with a
// clear Status if the process exits early or does not become healthy in time (the log tail is
// quoted). Both servers speak llama-server's /completion, so requests are timed at the client the
// same way for both. The process is stopped by Stop() or the destructor.
//
// Thread-safety: Complete/StreamComplete may be called from several threads at once (each call
// opens its own connection); Start/Stop from the owner thread only.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"
#include "skippy/common/subprocess.h"

namespace skippy::bench {

enum class ServerKind { kLlamaServer, kSkippyServer };

struct ModelServerOptions {
  ServerKind kind = ServerKind::kLlamaServer;
  std::string binary;               // path to llama-server or skippy-server
  std::string model_path;
  int ctx_size = 1024;
  int threads = 2;
  int parallel = 1;                 // llama-server slots / skippy-server lanes
  int batch_size = 512;
  bool flash_attn = true;
  bool flash_attn_auto = false;     // llama-server only: -fa auto (its default) instead of on/off
  std::vector<std::string> extra_args;
  std::chrono::seconds startup_timeout{60};
  std::chrono::seconds request_timeout{120};
  std::string log_path;
};

struct CompletionRun {
  bool ok = false;
  int http_status = 0;
  double client_ms = 0;      // wall time at the client, request sent to response read
  nlohmann::json timings;    // llama-server's `timings` object
  int tokens_cached = -1;
  int tokens_evaluated = -1;
  std::string content;
  std::string error;
  // With n_probs > 0: llama-server's completion_probabilities (per generated token: id, token,
  // logprob, top_logprobs [{id, token, logprob}]), as both servers send it.
  nlohmann::json probabilities = nlohmann::json::array();
};

struct StreamRun {
  bool ok = false;
  std::string content;
  nlohmann::json timings = nlohmann::json::object();  // from the final event, when sent
  nlohmann::json skippy = nlohmann::json::object();   // skippy-server's own block of the final event
  double ttft_ms = 0;        // request sent -> first token event (first event when none came)
  double total_ms = 0;
  int tokens = 0;
  double tpot_ms = 0;        // (total - ttft) / (tokens - 1)
  double max_gap_ms = 0;     // the longest wait between two token events: a stall the reader saw
  std::string error;
  // With n_probs > 0 (and return_tokens): the generated token ids and the events'
  // completion_probabilities, concatenated.
  std::vector<int64_t> token_ids;
  nlohmann::json probabilities = nlohmann::json::array();
  // From the final event: tokens generated (llama-server streams a token only with text, so ids
  // of a tail that is not valid UTF-8 never arrive) and why generation stopped.
  int tokens_predicted = -1;
  std::string stop_type;

  // `ok`: the stream brought events (HTTP 200). Ended without an error event: the request was
  // served, with no tokens where generation ended at once. A stream cut short by an error
  // (llama-server's, when its output parser rejects what the model wrote, even before any token)
  // is `ok` with its latencies as the client saw them, but not served.
  bool served() const { return ok && error.empty(); }
};

// Options for a server under comparison with the settings every comparison matches across servers
// (per-request context, threads, batch, flash attention, timeouts) taken from a benchmark's options
// (ProductionOptions, ServeCompareOptions: any type with those fields).
template <typename BenchOptions>
ModelServerOptions MatchedServerOptions(const BenchOptions& o, ServerKind kind, std::string binary, std::string model,
                                        int parallel, std::string log_path) {
  ModelServerOptions so;
  so.kind = kind;
  so.binary = std::move(binary);
  so.model_path = std::move(model);
  so.ctx_size = o.ctx_size;
  so.threads = o.threads;
  so.parallel = parallel;
  so.batch_size = o.batch_size;
  so.flash_attn = o.flash_attn;
  so.startup_timeout = std::chrono::seconds(o.server_startup_timeout_secs);
  so.request_timeout = std::chrono::seconds(o.request_timeout_secs);
  so.log_path = std::move(log_path);
  return so;
}

// StreamComplete against any server on a loopback port (a router in front of servers).
StreamRun StreamCompleteAt(int port, const std::string& prompt, int n_predict, int n_probs,
                           std::chrono::seconds timeout);

class ModelServer {
 public:
  [[nodiscard]] static StatusOr<ModelServer> Start(const ModelServerOptions& options);
  ModelServer(ModelServer&&) noexcept = default;
  ModelServer& operator=(ModelServer&&) noexcept = default;
  ~ModelServer() = default;

  int port() const { return port_; }
  pid_t pid() const { return process_.pid(); }
  // Peak resident memory of the server process (VmHWM), bytes; 0 if unknown.
  uint64_t PeakRssBytes() const;
  std::vector<std::string> argv() const { return argv_; }
  const std::string& log_path() const { return process_.log_path(); }

  // POST /completion {prompt, n_predict, temperature 0, cache_prompt true, n_probs if > 0}; never
  // throws.
  CompletionRun Complete(const std::string& prompt, int n_predict, int n_probs = 0) const;
  // Same with stream: true; TTFT is the first server-sent event that carries content. n_probs > 0
  // also asks for token ids and log-probabilities (StreamRun::token_ids, probabilities).
  StreamRun StreamComplete(const std::string& prompt, int n_predict, int n_probs = 0) const;
  int Stop() { return process_.Stop(); }

 private:
  ModelServer(Subprocess process, int port, std::vector<std::string> argv, ModelServerOptions options)
      : process_(std::move(process)), port_(port), argv_(std::move(argv)), options_(std::move(options)) {}
  Subprocess process_;
  int port_ = 0;
  std::vector<std::string> argv_;
  ModelServerOptions options_;
};

}  // namespace skippy::bench
