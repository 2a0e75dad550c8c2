#include "skippy/server/http_server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "httplib.h"
#include "nlohmann/json.hpp"
#include "skippy/common/http_worker_pool.h"
#include "skippy/common/strings.h"
#include "skippy/server/response.h"

namespace skippy::server {

using nlohmann::json;

namespace {

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) {
  if (e.http_status == 503) res.set_header("Retry-After", "1");
  SendJson(res, e.http_status, e.Body());
}

ApiError Loading() { return ApiError{503, "unavailable_error", "loading", "Loading model"}; }

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The tenant namespace of a request: the API key's namespace plus the request's cache salt,
// length-prefixed so no two (key namespace, salt) pairs compose to the same string.
std::string ComposeNamespace(const std::string& key_ns, const std::string& salt) {
  return StrCat(key_ns.size(), ":", key_ns, "|", salt);
}

}  // namespace

HttpServer::HttpServer(ServerOptions options) : options_(std::move(options)) {
  std::vector<std::string> namespaces;
  for (const auto& [key, ns] : options_.api_keys) namespaces.push_back(ns);
  tenants_ = std::make_unique<TenantUsage>(namespaces);
  std::random_device rd;
  instance_id_ = fmt::format("{:08x}{:08x}", rd(), rd());
}

HttpServer::~HttpServer() {
  Stop();
  if (loader_.joinable()) loader_.join();
}

void HttpServer::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stop_requested_ = true;
  if (scheduler_) scheduler_->events().Close();  // ends /cache/events streams
  if (http_) http_->stop();
}

Status HttpServer::Run() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stop_requested_) return absl::OkStatus();
    scheduler_ = std::make_unique<Scheduler>(options_, metrics_);
    http_ = std::make_unique<httplib::Server>();
  }
  const int threads = options_.http_threads > 0
                          ? options_.http_threads
                          : static_cast<int>(options_.lane_count + options_.queue_size + 8);
  const size_t most = std::max<size_t>(static_cast<size_t>(threads), static_cast<size_t>(options_.max_connections));
  http_->new_task_queue = [threads, most] {
    return new HttpWorkerPool(static_cast<size_t>(threads), most, std::max<size_t>(1, most / 4));
  };
  http_->set_payload_max_length(options_.max_body_bytes);
  // A stream writes one small event per token: without TCP_NODELAY, Nagle's algorithm holds an
  // event back until the client acknowledges the previous write, which a client's delayed ACK
  // makes up to 40 ms (a decoded-result hit's first token waited for the third decode).
  http_->set_tcp_nodelay(true);
  SetExclusiveListenSocket(*http_);
  http_->set_read_timeout(options_.io_timeout_seconds);
  http_->set_write_timeout(options_.io_timeout_seconds);
  Routes();
  if (!http_->bind_to_port(options_.host, options_.port)) {
    return absl::UnavailableError(StrCat("cannot listen on ", options_.host, ":", options_.port));
  }
  {
    // A Stop() before the bind closed no socket (there was none): honour it here. From now on
    // Stop() closes the bound socket, and listen_after_bind() returns at once or leaves its loop.
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stop_requested_) {
      http_->stop();
      return absl::OkStatus();
    }
  }
  std::fprintf(stderr, "skippy-server: listening on http://%s:%d (loading %s)\n", options_.host.c_str(),
               options_.port, options_.model_path.c_str());
  loader_ = std::thread([this] {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = scheduler_->Load();
    if (!s.ok()) {
      load_status_ = s;
      load_failed_ = true;
      std::fprintf(stderr, "skippy-server: cannot start: %s\n", std::string(s.message()).c_str());
      http_->stop();
      return;
    }
    std::fprintf(stderr, "skippy-server: model loaded in %.0f ms; serving %s on %u lanes, cache %s\n",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                 scheduler_->model_name().c_str(), options_.lane_count, scheduler_->cache_serving() ? "on" : "off");
  });
  http_->listen_after_bind();
  if (loader_.joinable()) loader_.join();
  scheduler_->Stop();
  if (load_failed_) return load_status_;
  return absl::OkStatus();
}

std::optional<std::string> HttpServer::KeyNamespace(const httplib::Request& req) const {
  if (options_.api_keys.empty()) return "";
  std::string key;
  const std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
  if (key.empty()) key = req.get_header_value("x-api-key");
  auto it = options_.api_keys.find(key);
  if (it == options_.api_keys.end()) return std::nullopt;
  return it->second;
}

std::optional<ApiError> HttpServer::CheckEnvelope(const httplib::Request& req) const {
  size_t header_bytes = 0;
  for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
  if (req.headers.size() > options_.max_headers || header_bytes > options_.max_header_bytes) {
    return ApiError{431, "invalid_request_error", "headers_too_large",
                    StrCat("request headers: ", req.headers.size(), " fields, ", header_bytes, " bytes; the limits are ",
                           options_.max_headers, " and ", options_.max_header_bytes)};
  }
  // The body is not read yet: refuse what it could not be, before reading a byte of it.
  if (req.has_header("Transfer-Encoding")) {
    return ApiError{411, "invalid_request_error", "length_required",
                    "send the body with a Content-Length (chunked request bodies are not accepted)"};
  }
  if (req.has_header("Content-Length")) {
    const std::string len = req.get_header_value("Content-Length");
    uint64_t n = 0;
    const bool digits = !len.empty() && len.size() <= 19 &&
                        std::all_of(len.begin(), len.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || req.get_header_value_count("Content-Length") != 1) {
      return BadRequest(StrCat("Content-Length '", len.substr(0, 32), "' is not a length"), "bad_content_length");
    }
    n = std::stoull(len);
    if (n > options_.max_body_bytes) {
      return ApiError{413, "invalid_request_error", "body_too_large",
                      StrCat("the request body is ", n, " bytes; the limit is ", options_.max_body_bytes)};
    }
  }
  return std::nullopt;
}

void HttpServer::Routes() {
  httplib::Server& s = *http_;
  // Before routing (and before the body is read): the request envelope, then authentication
  // (everything but /health).
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Responses are dynamic: byte ranges of them mean nothing, and a repeated Range would make
    // the server build a multipart body many times the size of the answer.
    const_cast<httplib::Request&>(req).ranges.clear();
    if (std::optional<ApiError> e = CheckEnvelope(req)) {
      res.set_header("Connection", "close");
      SendJson(res, e->http_status, e->Body());
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path == "/health" || KeyNamespace(req)) return httplib::Server::HandlerResponse::Unhandled;
    SendJson(res, 401, ApiError{401, "authentication_error", "invalid_api_key", "invalid or missing API key"}.Body());
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, res.status >= 500 ? "server_error" : "invalid_request_error", "http_error",
               StrCat("HTTP ", res.status)};
    if (res.status == 404) e = {404, "invalid_request_error", "not_found", StrCat("no route for ", req.method, " ", req.path)};
    if (res.status == 413) e = {413, "invalid_request_error", "body_too_large", "the request body is too large"};
    SendJson(res, e.http_status, e.Body());
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    SendJson(res, 500, ApiError{500, "server_error", "internal_error", what}.Body());
  });
  // Metrics label a request by its route, never by its raw path.
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.CountRequest(routes_.contains(req.path) ? req.path : "other", res.status);
  });
  auto route = [this](void (HttpServer::*handler)(const httplib::Request&, httplib::Response&)) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) { (this->*handler)(req, res); };
  };
  auto generate = [this](Endpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res) { Generate(endpoint, req, res); };
  };
  auto get = [&](const char* path, auto handler) {
    routes_.insert(path);
    s.Get(path, handler);
  };
  auto post = [&](const char* path, auto handler) {
    routes_.insert(path);
    s.Post(path, handler);
  };
  get("/health", route(&HttpServer::Health));
  get("/v1/models", route(&HttpServer::Models));
  get("/metrics", route(&HttpServer::MetricsText));
  get("/cache/stats", route(&HttpServer::CacheStats));
  post("/cache/clear", route(&HttpServer::CacheClear));
  post("/apply-template", route(&HttpServer::ApplyTemplateRoute));
  get("/cache/events", route(&HttpServer::CacheEvents));
  post("/cache/prompt-key", route(&HttpServer::PromptKey));
  post("/v1/completions", generate(Endpoint::kCompletions));
  post("/v1/chat/completions", generate(Endpoint::kChatCompletions));
  post("/completion", generate(Endpoint::kLlamaCompletion));
  post("/completions", generate(Endpoint::kLlamaCompletion));
  post("/chat/completions", generate(Endpoint::kChatCompletions));
}

bool HttpServer::RefuseNamespacedKey(const httplib::Request& req, httplib::Response& res) const {
  if (KeyNamespace(req).value_or("").empty()) return false;
  SendError(res, ApiError{403, "permission_error", "global_view",
                          "this view covers every tenant: it needs an API key without a namespace"});
  return true;
}

void HttpServer::Health(const httplib::Request&, httplib::Response& res) {
  if (!scheduler_->ready()) return SendError(res, Loading());
  SendJson(res, 200, {{"status", "ok"}});
}

void HttpServer::Models(const httplib::Request&, httplib::Response& res) {
  json data = json::array();
  if (scheduler_->ready()) {
    const runtime::Model& m = scheduler_->model();
    data.push_back({{"id", scheduler_->model_name()},
                    {"object", "model"},
                    {"created", NowSeconds()},
                    {"owned_by", "skippy"},
                    {"meta", {{"arch", m.arch()}, {"n_vocab", m.n_vocab()}, {"n_params", m.n_params()},
                              {"n_ctx_per_lane", scheduler_->lane_context()}}}});
  }
  SendJson(res, 200, {{"object", "list"}, {"data", data}});
}

void HttpServer::MetricsText(const httplib::Request& req, httplib::Response& res) {
  if (RefuseNamespacedKey(req, res)) return;
  res.set_content(metrics_.Render(scheduler_->gauges()), "text/plain; version=0.0.4");
}

void HttpServer::CacheStats(const httplib::Request& req, httplib::Response& res) {
  if (!scheduler_->ready()) return SendError(res, Loading());
  if (const std::string ns = KeyNamespace(req).value_or(""); !ns.empty()) {
    return SendJson(res, 200, {{"namespace", ns}, {"usage", tenants_->View(ns)}});
  }
  json j = scheduler_->CacheStats();
  j["limits"] = {{"max_body_bytes", options_.max_body_bytes}, {"max_headers", options_.max_headers},
                 {"max_header_bytes", options_.max_header_bytes}, {"max_json_depth", options_.max_json_depth},
                 {"max_messages", options_.max_messages}, {"io_timeout_seconds", options_.io_timeout_seconds},
                 {"http_threads", options_.http_threads}, {"max_connections", options_.max_connections},
                 {"queue_size", options_.queue_size}, {"cache_ram_mib", options_.cache_ram_mib},
                 {"cache_entries", options_.cache_entries}, {"decoded_ram_mib", options_.decoded_ram_mib},
                 {"decoded_entries", options_.decoded_entries}, {"cache_dir", options_.cache_dir},
                 {"cache_disk_gib", options_.cache_disk_gib},
                 {"shared_redis", options_.shared_host.empty() ? std::string()
                                                               : StrCat(options_.shared_host, ":", options_.shared_port)},
                 {"shared_timeout_ms", options_.shared_timeout_ms}};
  const Gauges g = scheduler_->gauges();
  j["lanes"] = g.lanes_total;
  j["lanes_busy"] = g.lanes_busy;
  j["queue_depth"] = g.queue_depth;
  j["tenants"] = tenants_->All();
  SendJson(res, 200, j);
}

void HttpServer::CacheClear(const httplib::Request& req, httplib::Response& res) {
  json body = json::object();
  if (!req.body.empty()) {
    if (Status shape = CheckJsonShape(req.body, Limits()); !shape.ok()) return SendError(res, FromStatus(shape));
    body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      return SendError(res, BadRequest("the body must be a JSON object", "invalid_json"));
    }
  }
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "cache_salt") return SendError(res, BadRequest(StrCat("unknown field '", it.key(), "'"), "unknown_field"));
  }
  const std::string key_ns = KeyNamespace(req).value_or("");
  std::optional<std::string> ns;
  if (body.contains("cache_salt")) {
    if (!body["cache_salt"].is_string()) return SendError(res, BadRequest("field 'cache_salt' must be a string"));
    ns = ComposeNamespace(key_ns, body["cache_salt"].get<std::string>());
  } else if (!key_ns.empty()) {
    ns = ComposeNamespace(key_ns, "");
  }
  auto n = scheduler_->ClearCache(ns);
  if (!n.ok()) return SendError(res, ApiError{503, "unavailable_error", "loading", std::string(n.status().message())});
  SendJson(res, 200, {{"cleared_entries", *n}, {"scope", ns ? "namespace" : "all"}});
}

void HttpServer::ApplyTemplateRoute(const httplib::Request& req, httplib::Response& res) {
  if (!scheduler_->ready()) return SendError(res, Loading());
  if (Status shape = CheckJsonShape(req.body, Limits()); !shape.ok()) return SendError(res, FromStatus(shape));
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return SendError(res, BadRequest("the request body is not valid JSON", "invalid_json"));
  auto text = ApplyTemplate(scheduler_->model(), body, Limits());
  if (!text.ok()) return SendError(res, FromStatus(text.status()));
  SendJson(res, 200, {{"prompt", *text}});
}

void HttpServer::CacheEvents(const httplib::Request& req, httplib::Response& res) {
  if (RefuseNamespacedKey(req, res)) return;
  struct Cursor {
    uint64_t after = 0;
    bool hello = false;
  };
  auto cursor = std::make_shared<Cursor>();
  cursor->after = scheduler_->events().last();  // events from now on
  const std::string instance = instance_id_;
  const uint32_t lanes = options_.lane_count;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [this, cursor, instance, lanes](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& payload) {
          const std::string frame = StrCat("data: ", payload, "\n\n");
          return sink.write(frame.data(), frame.size());
        };
        if (!cursor->hello) {
          cursor->hello = true;
          return send(json{{"kind", "hello"}, {"instance", instance}, {"lanes", lanes}, {"seq", cursor->after}}.dump());
        }
        CacheEventLog::Batch b = scheduler_->events().WaitAfter(cursor->after, std::chrono::seconds(1));
        if (b.closed) {
          sink.done();
          return true;
        }
        if (b.reset && !send(json{{"kind", "reset"}}.dump())) return false;
        for (const std::string& line : b.lines) {
          if (!send(line)) return false;
        }
        cursor->after = b.last;
        // A comment line now and then: a reader can tell a quiet replica from a dead connection.
        if (b.lines.empty()) {
          constexpr std::string_view kKeepalive = ": keepalive\n\n";
          return sink.write(kKeepalive.data(), kKeepalive.size());
        }
        return true;
      });
}

void HttpServer::PromptKey(const httplib::Request& req, httplib::Response& res) {
  if (!scheduler_->ready()) return SendError(res, Loading());
  const std::string which = req.get_param_value("endpoint");
  Endpoint endpoint = Endpoint::kChatCompletions;
  if (which == "completions") {
    endpoint = Endpoint::kCompletions;
  } else if (which == "completion") {
    endpoint = Endpoint::kLlamaCompletion;
  } else if (which != "chat") {
    return SendError(res, BadRequest("query parameter 'endpoint' must be chat, completions or completion"));
  }
  if (Status shape = CheckJsonShape(req.body, Limits()); !shape.ok()) return SendError(res, FromStatus(shape));
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return SendError(res, BadRequest("the request body is not valid JSON", "invalid_json"));
  auto request = ParseGenerationRequest(endpoint, body, Limits());
  if (!request.ok()) return SendError(res, FromStatus(request.status()));
  const ServerOptions& o = scheduler_->options();
  const Budget budget{o.ctx_per_lane, o.max_prompt_tokens, o.max_tokens_limit, o.default_max_tokens};
  auto prompt = PreparePrompt(scheduler_->model(), *request, static_cast<size_t>(budget.prompt_limit()));
  if (!prompt.ok()) return SendError(res, FromStatus(prompt.status(), "invalid_prompt"));
  const std::string ns = ComposeNamespace(KeyNamespace(req).value_or(""), request->cache_salt);
  SendJson(res, 200, {{"tokens", prompt->tokens}, {"ns", NamespaceKey(ns)}});
}

void HttpServer::Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  if (!scheduler_->ready()) return SendError(res, Loading());
  if (Status shape = CheckJsonShape(req.body, Limits()); !shape.ok()) return SendError(res, FromStatus(shape));
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return SendError(res, BadRequest("the request body is not valid JSON", "invalid_json"));
  auto request = ParseGenerationRequest(endpoint, body, Limits());
  if (!request.ok()) return SendError(res, FromStatus(request.status()));
  const ServerOptions& o = scheduler_->options();
  const Budget budget{o.ctx_per_lane, o.max_prompt_tokens, o.max_tokens_limit, o.default_max_tokens};
  auto prompt = PreparePrompt(scheduler_->model(), *request, static_cast<size_t>(budget.prompt_limit()));
  if (!prompt.ok()) return SendError(res, FromStatus(prompt.status(), "invalid_prompt"));
  auto max_tokens = CheckBudget(budget, prompt->tokens.size(), request->max_tokens);
  if (!max_tokens.ok()) return SendError(res, FromStatus(max_tokens.status()));
  if (prompt->tool_calling) ApplyToolCalling(*prompt->tool_calling, *request);
  const size_t n_prompt = prompt->tokens.size();
  std::shared_ptr<const runtime::ReplyParser> reply_parser = prompt->reply_parser;
  const std::string ns = ComposeNamespace(KeyNamespace(req).value_or(""), request->cache_salt);
  auto job = std::make_shared<Job>(*request, std::move(*prompt), ns, *max_tokens);
  job->OnDone([usage = tenants_.get(), key_ns = KeyNamespace(req).value_or("")](const Job::View& v) {
    usage->Count(key_ns, v);
  });
  if (Status st = scheduler_->Submit(job); !st.ok()) {
    const bool full = st.code() == absl::StatusCode::kResourceExhausted;
    if (full) metrics_.CountRejected();
    return SendError(res, full ? ApiError{503, "server_error", "queue_full", std::string(st.message())}
                               : ApiError{503, "unavailable_error", "unavailable", std::string(st.message())});
  }
  auto completion = std::make_shared<const Completion>(endpoint, *request, scheduler_->model_name(), n_prompt,
                                                      std::move(reply_parser));
  if (!request->stream) {
    // A client that leaves frees its lane at the next token, as a stream's does.
    while (!job->WaitDone(std::chrono::milliseconds(100))) {
      if (req.is_connection_closed()) job->Cancel();
    }
    const Job::View v = job->Wait();
    if (v.error) return SendError(res, *v.error);
    return SendJson(res, 200, completion->Body(v));
  }
  auto state = std::make_shared<Completion::StreamState>();
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, completion, state](size_t, httplib::DataSink& sink) { return completion->Stream(*job, *state, sink); },
      [job](bool success) {
        if (!success) job->Cancel();
      });
}

}  // namespace skippy::server
