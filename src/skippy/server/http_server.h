// HttpServer: the HTTP face of skippy-server (cpp-httplib), OpenAI- and llama-server-compatible.
//
// Endpoints:
//   GET  /health               200 {"status":"ok"} once the model is loaded, 503 while loading
//   GET  /v1/models            the one served model
//   POST /v1/completions       OpenAI completions (prompt: string, token ids, or a one-element array)
//   POST /v1/chat/completions  OpenAI chat completions (the GGUF's chat template, ChatML fallback)
//   POST /completion           llama-server's endpoint (n_predict, content, tokens_cached, timings)
//   GET  /metrics              Prometheus text
//   GET  /cache/stats          cache statistics (JSON); a namespaced key sees its own usage only
//   POST /cache/clear          {"cache_salt": s} clears one namespace; {} clears the caller's
//                              namespace ("" salt) when its API key has one, else everything
// Every generation endpoint streams Server-Sent Events with "stream": true.
//
// Auth: with --api-key, every endpoint but /health needs "Authorization: Bearer KEY" (or
// "x-api-key: KEY"); otherwise 401 with an OpenAI-style error body. A key given as KEY:NAMESPACE
// puts its requests in that cache namespace; a request's cache_salt is a namespace inside it.
// Tenants never share cache entries across namespaces; /metrics and /cache/events, which cover
// every tenant, answer 403 to a key with a namespace.
//
// Errors: every 4xx/5xx carries {"error": {"message", "type", "code"}}. Rejections for a full
// queue are 503 with Retry-After.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "skippy/common/status.h"
#include "skippy/server/api_error.h"
#include "skippy/server/metrics.h"
#include "skippy/server/request.h"
#include "skippy/server/scheduler.h"
#include "skippy/server/server_options.h"
#include "skippy/server/tenant_usage.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace skippy::server {

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();

  // Binds, loads the model in the background (health is 503 until done) and serves until Stop().
  // Returns an error if the port cannot be bound or the model cannot be loaded.
  [[nodiscard]] Status Run();
  // Ends Run() from any thread (a signal watcher, the loader on a failed load): before Run()
  // starts, Run() returns at once without binding or loading; a Stop() between the bind and the
  // accept loop is not lost; during the model load, Run() returns once the load has finished.
  void Stop();

 private:
  // The route table: every path and its handler (below), authentication, errors and the request log.
  void Routes();
  // The cache namespace of the request's API key: "" without --api-key; nullopt for a missing or
  // unknown key.
  std::optional<std::string> KeyNamespace(const httplib::Request& req) const;
  // The request envelope against the limits (header count and bytes, Content-Length, no chunked
  // bodies), before routing and before the body is read: the error to answer, if any.
  std::optional<ApiError> CheckEnvelope(const httplib::Request& req) const;
  // /metrics and /cache/events cover every tenant: a key with a namespace gets 403 (true: answered).
  bool RefuseNamespacedKey(const httplib::Request& req, httplib::Response& res) const;
  RequestLimits Limits() const { return {options_.max_json_depth, options_.max_messages}; }

  void Health(const httplib::Request& req, httplib::Response& res);
  void Models(const httplib::Request& req, httplib::Response& res);
  void MetricsText(const httplib::Request& req, httplib::Response& res);
  // GET /cache/stats: the whole cache, limits and every tenant's usage for a key without a
  // namespace; for a key with one, that namespace's own usage only (TenantUsage).
  void CacheStats(const httplib::Request& req, httplib::Response& res);
  void CacheClear(const httplib::Request& req, httplib::Response& res);
  void ApplyTemplateRoute(const httplib::Request& req, httplib::Response& res);
  // GET /cache/events: what the cache holds as it changes, as Server-Sent Events (a "hello" with
  // this process's instance id first; "reset" when the reader fell behind). Global view.
  void CacheEvents(const httplib::Request& req, httplib::Response& res);
  // POST /cache/prompt-key?endpoint=chat|completions|completion: the token ids and namespace key
  // a generation request's prompt would be cached under (for skippy-router); nothing is generated.
  void PromptKey(const httplib::Request& req, httplib::Response& res);
  // The three generation endpoints: parse, tokenize, check the budget, queue, answer (response.h).
  void Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);

  ServerOptions options_;
  std::set<std::string, std::less<>> routes_;  // the paths of the route table (metrics labels)
  // Random per process: a router following /cache/events tells a restarted replica (empty RAM)
  // from a reconnect.
  std::string instance_id_;
  Metrics metrics_;
  std::unique_ptr<TenantUsage> tenants_;  // per API-key namespace (GET /cache/stats)
  // Set once by Run() under stop_mu_, which Stop() holds while it reads them.
  std::mutex stop_mu_;
  bool stop_requested_ = false;  // guarded by stop_mu_
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<httplib::Server> http_;
  std::thread loader_;
  Status load_status_;
  std::atomic<bool> load_failed_{false};
};

}  // namespace skippy::server
