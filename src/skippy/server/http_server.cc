#include "skippy/server/http_server.h"

#include <chrono>
#include <cstdio>

#include "httplib.h"
#include "nlohmann/json.hpp"
#include "skippy/common/strings.h"

namespace skippy::server {

using nlohmann::json;

namespace {

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) {
  if (e.http_status == 503) res.set_header("Retry-After", "1");
  SendJson(res, e.http_status, e.Body());
}

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence.
size_t Utf8SafeLength(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

// The tenant namespace of a request: the API key's namespace plus the request's cache salt,
// length-prefixed so no two (key namespace, salt) pairs compose to the same string.
std::string ComposeNamespace(const std::string& key_ns, const std::string& salt) {
  return StrCat(key_ns.size(), ":", key_ns, "|", salt);
}

// llama-server's /completion "completion_probabilities" shape (n_probs).
json LogprobsJson(const std::vector<TokenLogprobs>& all) {
  json out = json::array();
  for (const TokenLogprobs& t : all) {
    json top = json::array();
    for (const auto& c : t.top) top.push_back({{"id", c.id}, {"token", c.piece}, {"logprob", c.logprob}});
    out.push_back(
        {{"id", t.chosen.id}, {"token", t.chosen.piece}, {"logprob", t.chosen.logprob}, {"top_logprobs", top}});
  }
  return out;
}

// OpenAI's chat "logprobs": {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json ChatLogprobsJson(const std::vector<TokenLogprobs>& all, int32_t top_n) {
  auto entry = [](const TokenLogprobs::Candidate& c) {
    std::vector<int> bytes;  // 0-255 (char is signed here)
    for (unsigned char ch : c.piece) bytes.push_back(ch);
    return json{{"token", c.piece}, {"logprob", c.logprob}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const TokenLogprobs& t : all) {
    json e = entry(t.chosen);
    e["top_logprobs"] = json::array();
    for (size_t i = 0; i < t.top.size() && i < static_cast<size_t>(top_n); ++i) e["top_logprobs"].push_back(entry(t.top[i]));
    content.push_back(std::move(e));
  }
  return {{"content", content}};
}

json TimingsJson(const JobTimings& t) {
  return {{"cache_n", t.cache_n},
          {"prompt_n", t.prompt_n},
          {"prompt_ms", t.prompt_ms},
          {"prompt_per_second", t.prompt_ms > 0 ? 1000.0 * t.prompt_n / t.prompt_ms : 0.0},
          {"predicted_n", t.predicted_n},
          {"predicted_ms", t.predicted_ms},
          {"predicted_per_second", t.predicted_ms > 0 ? 1000.0 * t.predicted_n / t.predicted_ms : 0.0}};
}

json SkippyJson(const JobTimings& t) {
  return {{"cache_hit", t.cache_miss_reason.empty()},
          {"cache_payload", t.cache_payload},
          {"cache_miss_reason", t.cache_miss_reason},
          {"decoded_result_hit", t.decoded_result_hit},
          {"queue_ms", t.queue_ms},
          {"ttft_ms", t.ttft_ms},
          {"restore_ms", t.restore_ms},
          {"record_ms", t.record_ms}};
}

json UsageJson(size_t prompt_tokens, const Job::View& v) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", v.tokens.size()},
          {"total_tokens", prompt_tokens + v.tokens.size()},
          {"prompt_tokens_details", {{"cached_tokens", v.timings.cache_n}}}};
}

}  // namespace

HttpServer::HttpServer(ServerOptions options) : options_(std::move(options)) {}

HttpServer::~HttpServer() {
  Stop();
  if (loader_.joinable()) loader_.join();
}

void HttpServer::Stop() {
  if (http_) http_->stop();
}

Status HttpServer::Run() {
  scheduler_ = std::make_unique<Scheduler>(options_, metrics_);
  http_ = std::make_unique<httplib::Server>();
  const int threads = options_.http_threads > 0
                          ? options_.http_threads
                          : static_cast<int>(options_.lane_count + options_.queue_size + 8);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_read_timeout(60);
  http_->set_write_timeout(60);
  Routes();
  if (!http_->bind_to_port(options_.host, options_.port)) {
    return absl::UnavailableError(StrCat("cannot listen on ", options_.host, ":", options_.port));
  }
  std::fprintf(stderr, "skippy-server: listening on http://%s:%d (loading %s)\n", options_.host.c_str(),
               options_.port, options_.model_path.c_str());
  loader_ = std::thread([this] {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = scheduler_->Load();
    if (!s.ok()) {
      load_status_ = s;
      load_failed_ = true;
      std::fprintf(stderr, "skippy-server: cannot load the model: %s\n", std::string(s.message()).c_str());
      http_->stop();
      return;
    }
    std::fprintf(stderr, "skippy-server: model loaded in %.0f ms; serving %s on %u lanes, cache %s\n",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                 scheduler_->model_name().c_str(), options_.lane_count, options_.cache_enabled ? "on" : "off");
  });
  http_->listen_after_bind();
  if (loader_.joinable()) loader_.join();
  scheduler_->Stop();
  if (load_failed_) return load_status_;
  return absl::OkStatus();
}

void HttpServer::Routes() {
  httplib::Server& s = *http_;

  // Authentication (everything but /health) and the key's namespace.
  auto key_of = [this](const httplib::Request& req) -> std::optional<std::string> {
    std::string key;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
    if (key.empty()) key = req.get_header_value("x-api-key");
    auto it = options_.api_keys.find(key);
    if (it == options_.api_keys.end()) return std::nullopt;
    return it->second;
  };
  auto key_namespace = [this, key_of](const httplib::Request& req) -> std::string {
    if (options_.api_keys.empty()) return "";
    return key_of(req).value_or("");
  };
  s.set_pre_routing_handler([this, key_of](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health" || options_.api_keys.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (!key_of(req)) {
      SendJson(res, 401,
               ApiError{401, "authentication_error", "invalid_api_key", "invalid or missing API key"}.Body());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
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
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.CountRequest(req.path, res.status);
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (scheduler_->ready()) {
      SendJson(res, 200, {{"status", "ok"}});
    } else {
      SendJson(res, 503, ApiError{503, "unavailable_error", "loading", "Loading model"}.Body());
    }
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
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
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.Render(scheduler_->gauges()), "text/plain; version=0.0.4");
  });

  s.Get("/cache/stats", [this](const httplib::Request&, httplib::Response& res) {
    if (!scheduler_->ready()) return SendError(res, ApiError{503, "unavailable_error", "loading", "Loading model"});
    json j = scheduler_->CacheStats();
    const Gauges g = scheduler_->gauges();
    j["lanes"] = g.lanes_total;
    j["lanes_busy"] = g.lanes_busy;
    j["queue_depth"] = g.queue_depth;
    SendJson(res, 200, j);
  });

  s.Post("/cache/clear", [this, key_namespace](const httplib::Request& req, httplib::Response& res) {
    json body = json::object();
    if (!req.body.empty()) {
      body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object()) return SendError(res, BadRequest("the body must be a JSON object", "invalid_json"));
    }
    for (auto it = body.begin(); it != body.end(); ++it) {
      if (it.key() != "cache_salt") return SendError(res, BadRequest(StrCat("unknown field '", it.key(), "'"), "unknown_field"));
    }
    const std::string key_ns = key_namespace(req);
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
  });

  s.Post("/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
    if (!scheduler_->ready()) return SendError(res, ApiError{503, "unavailable_error", "loading", "Loading model"});
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) return SendError(res, BadRequest("the request body is not valid JSON", "invalid_json"));
    auto text = ApplyTemplate(scheduler_->model(), body);
    if (!text.ok()) return SendError(res, BadRequest(std::string(text.status().message()), "invalid_request"));
    SendJson(res, 200, {{"prompt", *text}});
  });

  auto generate = [this, key_namespace](Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    if (!scheduler_->ready()) return SendError(res, ApiError{503, "unavailable_error", "loading", "Loading model"});
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) return SendError(res, BadRequest("the request body is not valid JSON", "invalid_json"));
    auto parsed = ParseGenerationRequest(endpoint, body);
    if (!parsed.ok()) {
      const std::string msg(parsed.status().message());
      const std::string code = msg.rfind("unknown field", 0) == 0 ? "unknown_field"
                               : msg.rfind("unsupported", 0) == 0 ? "unsupported_field"
                                                                  : "invalid_request";
      return SendError(res, BadRequest(msg, code));
    }
    GenerationRequest request = std::move(*parsed);
    auto prompt = PreparePrompt(scheduler_->model(), request);
    if (!prompt.ok()) return SendError(res, BadRequest(std::string(prompt.status().message()), "invalid_prompt"));
    const ServerOptions& o = scheduler_->options();
    const int64_t ctx = o.ctx_per_lane;
    const int64_t n = static_cast<int64_t>(prompt->tokens.size());
    const int64_t max_prompt = o.max_prompt_tokens > 0 ? std::min<int64_t>(o.max_prompt_tokens, ctx) : ctx;
    if (n > max_prompt) {
      return SendError(res, BadRequest(StrCat("the prompt has ", n, " tokens; the limit is ", max_prompt, " (context ",
                                              ctx, " per request)"),
                                       "context_length_exceeded"));
    }
    int64_t max_tokens = request.max_tokens;
    if (max_tokens < 0) {
      max_tokens = std::min<int64_t>(o.default_max_tokens, ctx - n);
    } else {
      const int64_t limit = o.max_tokens_limit > 0 ? std::min<int64_t>(o.max_tokens_limit, ctx) : ctx;
      if (max_tokens > limit) {
        return SendError(res, BadRequest(StrCat("max_tokens ", max_tokens, " exceeds the limit of ", limit), "invalid_max_tokens"));
      }
      if (n + max_tokens > ctx) {
        return SendError(res, BadRequest(StrCat("prompt (", n, " tokens) + max_tokens (", max_tokens,
                                                ") exceeds the context of ", ctx, " tokens per request"),
                                         "context_length_exceeded"));
      }
    }
    if (max_tokens < 0) max_tokens = 0;
    const std::string ns = ComposeNamespace(key_namespace(req), request.cache_salt);
    auto job = std::make_shared<Job>(request, std::move(*prompt), ns, max_tokens);
    if (Status st = scheduler_->Submit(job); !st.ok()) {
      if (st.code() == absl::StatusCode::kResourceExhausted) metrics_.CountRejected();
      ApiError e = st.code() == absl::StatusCode::kResourceExhausted
                       ? ApiError{503, "server_error", "queue_full", std::string(st.message())}
                       : ApiError{503, "unavailable_error", "unavailable", std::string(st.message())};
      return SendError(res, e);
    }

    static std::atomic<uint64_t> next_id{1};
    const std::string id = StrCat(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", next_id++);
    const int64_t created = NowSeconds();
    const std::string model = scheduler_->model_name();
    const size_t n_prompt = static_cast<size_t>(n);

    if (!request.stream) {
      Job::View v = job->Wait();
      if (v.error) return SendError(res, *v.error);
      json out;
      if (endpoint == Endpoint::kLlamaCompletion) {
        out = {{"content", v.text},
               {"model", model},
               {"stop", true},
               {"stop_type", v.finish_reason == "length" ? "limit" : "eos"},
               {"tokens_predicted", v.tokens.size()},
               {"tokens_evaluated", n_prompt},
               {"tokens_cached", v.timings.cache_n},
               {"truncated", false},
               {"timings", TimingsJson(v.timings)},
               {"skippy", SkippyJson(v.timings)}};
        if (request.return_tokens) out["tokens"] = v.tokens;
        if (request.n_probs > 0) out["completion_probabilities"] = LogprobsJson(v.logprobs);
      } else if (endpoint == Endpoint::kCompletions) {
        out = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
               {"choices", json::array({{{"text", v.text}, {"index", 0}, {"logprobs", nullptr},
                                         {"finish_reason", v.finish_reason}}})},
               {"usage", UsageJson(n_prompt, v)}, {"timings", TimingsJson(v.timings)},
               {"skippy", SkippyJson(v.timings)}};
        if (request.return_tokens) out["tokens"] = v.tokens;
      } else {
        out = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
               {"choices", json::array({{{"index", 0},
                                         {"message", {{"role", "assistant"}, {"content", v.text}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", v.finish_reason}}})},
               {"usage", UsageJson(n_prompt, v)}, {"timings", TimingsJson(v.timings)},
               {"skippy", SkippyJson(v.timings)}};
        if (request.return_tokens) out["tokens"] = v.tokens;
        if (request.chat_logprobs) out["choices"][0]["logprobs"] = ChatLogprobsJson(v.logprobs, request.top_logprobs);
      }
      return SendJson(res, 200, out);
    }

    // Streaming (SSE). Text is sent only up to a complete UTF-8 character, and while stop strings
    // are active the last (longest stop - 1) bytes are held back until the end.
    size_t hold = 0;
    for (const auto& st : request.stop) hold = std::max(hold, st.size() - 1);
    struct StreamState {
      size_t sent_tokens = 0;
      size_t sent_bytes = 0;
      bool started = false;
    };
    auto state = std::make_shared<StreamState>();
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, state, endpoint, id, created, model, n_prompt, hold, include_usage = request.include_usage,
         return_tokens = request.return_tokens, n_probs = request.n_probs](size_t, httplib::DataSink& sink) {
          auto event = [&](const json& j) {
            const std::string line = StrCat("data: ", Dump(j), "\n\n");
            return sink.write(line.data(), line.size());
          };
          // probs: the new tokens' log-probabilities (/completion with n_probs, as llama-server streams them).
          auto chunk = [&](const std::string& text, const std::vector<runtime::Token>& toks,
                           const std::optional<std::string>& finish,
                           const std::vector<TokenLogprobs>& probs = {}) -> json {
            if (endpoint == Endpoint::kLlamaCompletion) {
              json j = {{"content", text}, {"stop", false}};
              if (return_tokens) j["tokens"] = toks;
              if (n_probs > 0) j["completion_probabilities"] = LogprobsJson(probs);
              return j;
            }
            json fr = finish ? json(*finish) : json(nullptr);
            if (endpoint == Endpoint::kCompletions) {
              json j = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                        {"choices", json::array({{{"text", text}, {"index", 0}, {"logprobs", nullptr},
                                                  {"finish_reason", fr}}})}};
              if (return_tokens) j["tokens"] = toks;
              return j;
            }
            json delta = json::object();
            if (!finish) delta["content"] = text;
            json j = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                      {"choices", json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr},
                                                {"finish_reason", fr}}})}};
            if (return_tokens) j["tokens"] = toks;
            return j;
          };
          if (!state->started) {
            state->started = true;
            if (endpoint == Endpoint::kChatCompletions) {
              json first = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                            {"choices", json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                      {"logprobs", nullptr}, {"finish_reason", nullptr}}})}};
              if (!event(first)) {
                job->Cancel();
                return false;
              }
            }
          }
          while (true) {
            Job::View v = job->WaitFor(state->sent_tokens, std::chrono::milliseconds(200));
            if (v.done && v.error) {
              json err = v.error->Body();
              event(err);
              sink.done();
              return true;
            }
            size_t upto = v.done ? v.text.size() : Utf8SafeLength(v.text);
            if (!v.done) upto = upto > hold ? std::min(upto, v.text.size() - std::min(hold, v.text.size())) : 0;
            upto = std::max(upto, state->sent_bytes);
            if (upto > state->sent_bytes || v.tokens.size() > state->sent_tokens) {
              std::vector<runtime::Token> toks(v.tokens.begin() + static_cast<long>(std::min(state->sent_tokens, v.tokens.size())),
                                               v.tokens.end());
              const std::string text = v.text.substr(state->sent_bytes, upto - state->sent_bytes);
              std::vector<TokenLogprobs> probs;
              if (n_probs > 0 && v.logprobs.size() > state->sent_tokens) {
                probs.assign(v.logprobs.begin() + static_cast<long>(state->sent_tokens), v.logprobs.end());
              }
              if (!text.empty() || ((return_tokens || n_probs > 0) && !toks.empty())) {
                if (!event(chunk(text, toks, std::nullopt, probs))) {
                  job->Cancel();
                  return false;
                }
              }
              state->sent_bytes = upto;
              state->sent_tokens = v.tokens.size();
            } else if (!v.done) {
              // Nothing new: a comment line keeps the connection honest (and finds a gone client).
              static const char kPing[] = ": ping\n\n";
              if (!sink.is_writable() || !sink.write(kPing, sizeof kPing - 1)) {
                job->Cancel();
                return false;
              }
            }
            if (v.done) {
              json last;
              if (endpoint == Endpoint::kLlamaCompletion) {
                last = {{"content", ""}, {"stop", true}, {"model", model},
                        {"stop_type", v.finish_reason == "length" ? "limit" : "eos"},
                        {"tokens_predicted", v.tokens.size()}, {"tokens_evaluated", n_prompt},
                        {"tokens_cached", v.timings.cache_n}, {"timings", TimingsJson(v.timings)},
                        {"skippy", SkippyJson(v.timings)}};
              } else {
                last = chunk("", {}, v.finish_reason);
                last["timings"] = TimingsJson(v.timings);
                last["skippy"] = SkippyJson(v.timings);
                if (include_usage) last["usage"] = UsageJson(n_prompt, v);
              }
              bool ok = event(last);
              if (ok && endpoint != Endpoint::kLlamaCompletion) {
                static const char kDone[] = "data: [DONE]\n\n";
                ok = sink.write(kDone, sizeof kDone - 1);
              }
              sink.done();
              return ok;
            }
          }
        },
        [job](bool success) {
          if (!success) job->Cancel();
        });
  };

  s.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kCompletions, req, res);
  });
  s.Post("/v1/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kChatCompletions, req, res);
  });
  s.Post("/completion", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kLlamaCompletion, req, res);
  });
  s.Post("/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kLlamaCompletion, req, res);
  });
  s.Post("/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kChatCompletions, req, res);
  });
}

}  // namespace skippy::server
