// skippy-router: an OpenAI-compatible front over N skippy-server replicas of one model (or any
// OpenAI-compatible servers, with --policy round-robin). Every generation request is proxied to
// one replica, streamed responses passed through as they come; the replica is chosen by the
// policy (policy.h) from what each replica's cache holds (ReplicaView, fed by the replica's
// GET /cache/events) and the requests the router has in flight there. The prompt's token ids and
// namespace key come from a replica's POST /cache/prompt-key, so the router tokenizes exactly as
// the replicas do and never guesses from text.
//
// Faults: a replica that fails its health check (GET /health, every health_interval) or refuses a
// connection is skipped until it answers again; a request whose replica fails before answering is
// sent to the next choice (up to `retries` times), and so is one a replica answers 503 (all its
// lanes and queue busy, loading, draining; the client gets the last 503 with its Retry-After when
// no replica takes it). A request that is not streamed and takes longer than read_timeout_seconds
// is answered 504, neither retried nor held against the replica. The client's credentials go on
// in the header it sent them in (Authorization or X-Api-Key). A stream is held until its first event that
// carries the answer (a token, an error, the end; not a keepalive or the chat role chunk), so a
// replica that dies in the prefill is retried too; a stream cut after that ends with an error
// event, since the tokens already sent cannot be taken back. Every outcome is counted (GET /metrics, /router/stats).
// On Stop, new requests get 503 and requests in flight finish (drain).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"
#include "skippy/router/policy.h"
#include "skippy/router/replica_view.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace skippy::router {

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8090;
  std::vector<std::string> replicas;  // "host:port"
  Policy policy = Policy::kCacheAware;
  PolicyOptions policy_options;
  std::string replica_key;            // API key for /cache/events on replicas that require keys
  int retries = 2;
  std::chrono::milliseconds health_interval{500};
  int read_timeout_seconds = 600;     // a replica's answer may take this long
  int http_threads = 64;              // workers always running
  int max_connections = 1024;         // workers grow up to this; a quarter more wait; then closed
};

class Router {
 public:
  explicit Router(RouterOptions options);
  ~Router();

  // Binds, starts following the replicas and serves until Stop(). Unavailable when it cannot bind.
  [[nodiscard]] Status Run();
  // New requests get 503 from now on; those in flight go on (drain).
  void BeginDrain() { stopping_ = true; }
  // Stops serving (Run returns).
  void Stop();
  // Requests being proxied now.
  int in_flight() const { return in_flight_.load(); }
  nlohmann::json StatsJson() const;

 private:
  struct Replica;
  struct Counters;

  void Routes();
  void Proxy(const std::string& path, const httplib::Request& req, httplib::Response& res);
  // The prompt's token ids and namespace key from a replica (empty on failure: route by load).
  std::pair<std::vector<Token>, std::string> PromptKey(const std::string& path, const httplib::Request& req);
  std::optional<Choice> Pick(const std::vector<Token>& tokens, const std::string& ns_key,
                             const std::vector<bool>& excluded);
  void Follow(Replica& r);       // the replica's event stream, reconnecting
  void HealthLoop();
  std::string MetricsText() const;

  const RouterOptions options_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<Counters> counters_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> in_flight_{0};
  std::mutex rr_mu_;
  uint64_t rr_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace skippy::router
