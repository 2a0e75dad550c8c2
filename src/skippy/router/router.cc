#include "skippy/router/router.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <future>
#include <optional>
#include <string_view>

#include "httplib.h"
#include "skippy/common/http_worker_pool.h"
#include "skippy/common/strings.h"

namespace skippy::router {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

void SendError(httplib::Response& res, int status, const std::string& code, const std::string& message) {
  res.status = status;
  res.set_content(json{{"error", {{"message", message}, {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                                  {"code", code}}}}
                      .dump(),
                  "application/json");
}

// The /cache/prompt-key endpoint name of a generation path.
const char* PromptKeyEndpoint(const std::string& path) {
  if (path == "/v1/chat/completions" || path == "/chat/completions") return "chat";
  if (path == "/v1/completions") return "completions";
  return "completion";
}

// The client's credentials, in either header a replica reads them from.
httplib::Headers ForwardHeaders(const httplib::Request& req) {
  httplib::Headers h;
  for (const char* name : {"Authorization", "X-Api-Key"}) {
    if (req.has_header(name)) h.emplace(name, req.get_header_value(name));
  }
  return h;
}

// A replica's 503 (all lanes and its queue busy, loading, draining): another replica may take the
// request; if none does, the client gets the last such answer, Retry-After included.
struct Busy {
  int status = 0;
  std::string body, content_type, retry_after;
};
void SendBusy(const Busy& b, httplib::Response& res) {
  res.status = b.status;
  if (!b.retry_after.empty()) res.set_header("Retry-After", b.retry_after);
  res.set_content(b.body, b.content_type.empty() ? "application/json" : b.content_type);
}

// Whether an SSE event commits a stream to the replica that sent it. Comments (keepalives) and
// the chat role-only first chunk carry nothing of the answer, so a replica that dies after them
// can still be replaced by another; anything else (a token, an error, the last event) cannot.
bool Commits(std::string_view event) {
  if (event.empty() || event.front() == ':') return false;
  if (event.rfind("data: ", 0) != 0) return true;
  const json j = json::parse(event.substr(6), nullptr, false);
  if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return true;
  for (const json& c : j["choices"]) {
    if (!c.is_object() || !c.contains("delta") || !c["delta"].is_object()) return true;
    if (!c.value("finish_reason", json()).is_null()) return true;
    for (const auto& [k, v] : c["delta"].items()) {
      if (k == "role") continue;
      if (k == "content" && v.is_string() && v.get<std::string>().empty()) continue;
      return true;
    }
  }
  return false;
}

// A streamed answer on its way from a replica to the client: the upstream thread pushes, the
// client's content provider pops. Nothing reaches the client until the stream is `committed`
// (Commits): until then a failed replica is retried elsewhere and its events are dropped.
// The longest event a replica's /cache/events stream may send (an entry's tokens are the
// largest part); a stream past it without an event's end is dropped and followed again.
constexpr size_t kMaxEventBytes = size_t{16} << 20;

struct Pipe {
  std::mutex mu;
  std::condition_variable cv;
  bool headers = false;
  int status = 0;
  std::string content_type;
  std::string retry_after;
  std::deque<std::string> chunks;
  std::string scan;        // bytes not yet split into events, until committed
  bool committed = false;
  bool done = false;
  bool ok = false;           // the upstream request completed
  bool client_gone = false;  // the client left: stop reading upstream (the replica cancels)
};

}  // namespace

struct Router::Replica {
  std::string host;
  int port = 0;
  std::string name;
  std::atomic<bool> healthy{false};
  std::atomic<int> in_flight{0};
  std::atomic<int> lanes{1};
  std::atomic<bool> follows{false};  // its event stream is connected
  ReplicaView view{16};
  std::atomic<uint64_t> requests{0}, by_prefix{0}, by_load{0}, by_rr{0}, failures{0}, matched_tokens{0};
};

struct Router::Counters {
  std::atomic<uint64_t> requests{0};         // generation requests received
  std::atomic<uint64_t> retries{0};          // sent again to another replica
  std::atomic<uint64_t> unavailable{0};      // answered 503: no replica could take it
  std::atomic<uint64_t> streams_cut{0};      // a replica failed mid-stream: error event sent
  std::atomic<uint64_t> client_gone{0};      // the client left before its answer began
  std::atomic<uint64_t> timeouts{0};         // answered 504: a replica took longer than the read timeout
  std::atomic<uint64_t> busy_replicas{0};    // a replica answered 503 (busy, loading, draining): sent on
  std::atomic<uint64_t> prompt_key_failures{0};
  std::atomic<uint64_t> shared_hits{0};      // answers whose prefix a replica fetched from the shared tier
  std::atomic<uint64_t> prompt_tokens{0};    // tokens of prompts routed with a known prompt
};

Router::Router(RouterOptions options) : options_(std::move(options)), counters_(std::make_unique<Counters>()) {
  for (const std::string& r : options_.replicas) {
    auto rep = std::make_unique<Replica>();
    const size_t colon = r.rfind(':');
    rep->host = r.substr(0, colon);
    rep->port = std::atoi(r.c_str() + colon + 1);
    rep->name = r;
    replicas_.push_back(std::move(rep));
  }
}

Router::~Router() { Stop(); }

void Router::Stop() {
  stopping_ = true;
  if (http_) http_->stop();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

Status Router::Run() {
  http_ = std::make_unique<httplib::Server>();
  const size_t threads = static_cast<size_t>(std::max(4, options_.http_threads));
  const size_t most = std::max(threads, static_cast<size_t>(options_.max_connections));
  http_->new_task_queue = [threads, most] { return new HttpWorkerPool(threads, most, std::max<size_t>(1, most / 4)); };
  http_->set_payload_max_length(64u << 20);
  http_->set_tcp_nodelay(true);  // one small write per streamed event (see skippy-server)
  SetExclusiveListenSocket(*http_);
  Routes();
  if (!http_->bind_to_port(options_.host.c_str(), options_.port)) {
    return absl::UnavailableError(StrCat("cannot listen on ", options_.host, ":", options_.port));
  }
  threads_.emplace_back([this] { HealthLoop(); });
  if (options_.policy == Policy::kCacheAware) {
    for (auto& r : replicas_) threads_.emplace_back([this, rp = r.get()] { Follow(*rp); });
  }
  std::fprintf(stderr, "skippy-router: listening on http://%s:%d over %zu replicas (%s)\n", options_.host.c_str(),
               options_.port, replicas_.size(), options_.policy == Policy::kCacheAware ? "cache-aware" : "round-robin");
  http_->listen_after_bind();
  return absl::OkStatus();
}

void Router::Routes() {
  httplib::Server& s = *http_;
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/completion", "/completions", "/chat/completions"}) {
    s.Post(path, [this, p = std::string(path)](const httplib::Request& req, httplib::Response& res) { Proxy(p, req, res); });
  }
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    bool any = false;
    for (const auto& r : replicas_) any = any || r->healthy;
    res.status = any && !stopping_ ? 200 : 503;
    res.set_content(json{{"status", any ? "ok" : "no healthy replica"}}.dump(), "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    for (const auto& r : replicas_) {
      if (!r->healthy) continue;
      httplib::Client c(r->host, r->port);
      c.set_connection_timeout(1);
      if (auto got = c.Get("/v1/models", ForwardHeaders(req))) {
        res.status = got->status;
        res.set_content(got->body, "application/json");
        return;
      }
    }
    SendError(res, 503, "no_replica", "no healthy replica");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4");
  });
  s.Get("/router/stats", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(StatsJson().dump(), "application/json");
  });
}

std::pair<std::vector<Token>, std::string> Router::PromptKey(const std::string& path, const httplib::Request& req) {
  // Any healthy replica renders and tokenizes the same way; the least busy one answers fastest.
  std::vector<Replica*> order;
  for (auto& r : replicas_) {
    if (r->healthy && r->follows) order.push_back(r.get());
  }
  std::sort(order.begin(), order.end(), [](Replica* a, Replica* b) { return a->in_flight < b->in_flight; });
  for (Replica* r : order) {
    httplib::Client c(r->host, r->port);
    c.set_connection_timeout(1);
    c.set_read_timeout(10);
    auto got = c.Post(StrCat("/cache/prompt-key?endpoint=", PromptKeyEndpoint(path)), ForwardHeaders(req), req.body,
                      "application/json");
    if (!got) continue;  // that replica failed: ask another
    if (got->status != 200) break;  // the request itself is refused: the replica it goes to says why
    json j = json::parse(got->body, nullptr, false);
    if (j.is_object() && j.contains("tokens") && j["tokens"].is_array()) {
      try {
        return {j["tokens"].get<std::vector<Token>>(), j.value("ns", "")};
      } catch (const json::exception&) {
      }
    }
    break;
  }
  ++counters_->prompt_key_failures;
  return {};
}

std::optional<Choice> Router::Pick(const std::vector<Token>& tokens, const std::string& ns_key,
                                   const std::vector<bool>& excluded) {
  std::vector<Candidate> cs(replicas_.size());
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const Replica& r = *replicas_[i];
    cs[i].healthy = r.healthy && !excluded[i];
    cs[i].in_flight = r.in_flight;
    cs[i].lanes = r.lanes;
    cs[i].matched = tokens.empty() ? 0 : r.view.Match(ns_key, tokens);
  }
  std::lock_guard<std::mutex> lock(rr_mu_);
  return Choose(options_.policy, options_.policy_options, cs, tokens.size(), rr_);
}

void Router::Proxy(const std::string& path, const httplib::Request& req, httplib::Response& res) {
  if (stopping_) return SendError(res, 503, "draining", "the router is shutting down");
  ++counters_->requests;
  ++in_flight_;
  // Released when the request is over, streamed or not (the provider outlives this handler).
  std::shared_ptr<void> in_flight(nullptr, [this](void*) { --in_flight_; });
  // A "stream" that is not a boolean goes as a request that is not streamed: the replica answers
  // its 400 (null is absent there too).
  const json body = json::parse(req.body, nullptr, false);
  const auto stream_field = body.is_object() ? body.find("stream") : body.end();
  const bool stream = body.is_object() && stream_field != body.end() && stream_field->is_boolean() &&
                      stream_field->get<bool>();
  std::vector<Token> tokens;
  std::string ns_key;
  if (options_.policy == Policy::kCacheAware) std::tie(tokens, ns_key) = PromptKey(path, req);
  if (!tokens.empty()) counters_->prompt_tokens += tokens.size();
  std::vector<bool> excluded(replicas_.size(), false);
  std::optional<Busy> busy;
  for (int attempt = 0; attempt <= options_.retries; ++attempt) {
    const std::optional<Choice> choice = Pick(tokens, ns_key, excluded);
    if (!choice) break;
    Replica& r = *replicas_[choice->replica];
    if (attempt > 0) ++counters_->retries;
    ++r.requests;
    ++(choice->by == RoutedBy::kPrefix ? r.by_prefix : choice->by == RoutedBy::kLoad ? r.by_load : r.by_rr);
    if (!tokens.empty()) {
      r.matched_tokens += r.view.Match(ns_key, tokens);
      r.view.Routed(ns_key, tokens);
    }
    ++r.in_flight;
    if (!stream) {
      httplib::Client c(r.host, r.port);
      c.set_connection_timeout(2);
      c.set_read_timeout(options_.read_timeout_seconds);
      // The answer is awaited beside the client's connection: a client that leaves closes the
      // replica's connection too, and the replica cancels the generation.
      const auto sent = std::chrono::steady_clock::now();
      auto pending = std::async(std::launch::async, [&] { return c.Post(path, ForwardHeaders(req), req.body, "application/json"); });
      bool client_left = false;
      while (pending.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
        if (!client_left && req.is_connection_closed()) {
          client_left = true;
          c.stop();
        }
      }
      auto got = pending.get();
      --r.in_flight;
      if (client_left) {
        ++counters_->client_gone;
        return;
      }
      // httplib reports a read that timed out as a failed read: the time tells them apart.
      const bool timed_out = !got && (got.error() == httplib::Error::Timeout ||
                                      (got.error() == httplib::Error::Read &&
                                       std::chrono::steady_clock::now() - sent >=
                                           std::chrono::seconds(options_.read_timeout_seconds)));
      if (timed_out) {
        // The replica took longer than the read timeout to answer: a generation that long would
        // take as long elsewhere, so it is neither retried nor held against the replica's health
        // (the health checks judge that).
        ++counters_->timeouts;
        return SendError(res, 504, "replica_timeout",
                         "the replica did not answer within the router's --read-timeout-secs");
      }
      if (!got) {  // no answer: the replica is down or died mid-request
        ++r.failures;
        r.healthy = false;
        excluded[choice->replica] = true;
        continue;
      }
      if (got->status == 503) {  // busy, loading or draining: the next replica may take it
        ++counters_->busy_replicas;
        busy = Busy{got->status, got->body, got->get_header_value("Content-Type"), got->get_header_value("Retry-After")};
        excluded[choice->replica] = true;
        continue;
      }
      if (got->status == 200 && got->body.find("\"cache_tier\":\"shared\"") != std::string::npos) {
        ++counters_->shared_hits;
      }
      res.status = got->status;
      res.set_content(got->body, got->get_header_value("Content-Type").empty()
                                     ? "application/json"
                                     : got->get_header_value("Content-Type"));
      return;
    }
    auto pipe = std::make_shared<Pipe>();
    httplib::Request up;
    up.method = "POST";
    up.path = path;
    up.headers = ForwardHeaders(req);
    up.headers.emplace("Content-Type", "application/json");
    up.body = req.body;
    up.response_handler = [pipe](const httplib::Response& r) {
      std::lock_guard<std::mutex> lock(pipe->mu);
      pipe->headers = true;
      pipe->status = r.status;
      pipe->content_type = r.get_header_value("Content-Type");
      pipe->retry_after = r.get_header_value("Retry-After");
      pipe->cv.notify_all();
      return true;
    };
    up.content_receiver = [pipe](const char* data, size_t n, uint64_t, uint64_t) {
      std::lock_guard<std::mutex> lock(pipe->mu);
      if (pipe->client_gone) return false;
      pipe->chunks.emplace_back(data, n);
      if (!pipe->committed) {
        pipe->scan.append(data, n);
        for (size_t end; !pipe->committed && (end = pipe->scan.find("\n\n")) != std::string::npos;) {
          pipe->committed = Commits(std::string_view(pipe->scan).substr(0, end));
          pipe->scan.erase(0, end + 2);
        }
        if (pipe->committed) pipe->scan.clear();
      }
      pipe->cv.notify_all();
      return true;
    };
    Replica* rp = &r;
    std::thread([pipe, up = std::move(up), rp, timeout = options_.read_timeout_seconds]() mutable {
      httplib::Client c(rp->host, rp->port);
      c.set_connection_timeout(2);
      c.set_read_timeout(timeout);
      c.set_tcp_nodelay(true);
      httplib::Response resp;
      httplib::Error err = httplib::Error::Success;
      const bool ok = c.send(up, resp, err);
      --rp->in_flight;
      std::lock_guard<std::mutex> lock(pipe->mu);
      pipe->done = true;
      pipe->ok = ok;
      pipe->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(pipe->mu);
    pipe->cv.wait(lock, [&] { return pipe->headers || pipe->done; });
    if (!pipe->headers) {  // never answered: try the next replica
      ++r.failures;
      r.healthy = false;
      excluded[choice->replica] = true;
      continue;
    }
    if (pipe->status != 200) {  // refused (4xx) or failed before streaming: pass the answer on
      pipe->cv.wait(lock, [&] { return pipe->done; });
      std::string all;
      for (const std::string& c : pipe->chunks) all += c;
      if (pipe->status == 503) {  // busy, loading or draining: the next replica may take it
        ++counters_->busy_replicas;
        busy = Busy{pipe->status, std::move(all), pipe->content_type, pipe->retry_after};
        excluded[choice->replica] = true;
        continue;
      }
      res.status = pipe->status;
      res.set_content(all, pipe->content_type.empty() ? "application/json" : pipe->content_type);
      return;
    }
    // Held until the replica says something of the answer (a prefill can die with the replica).
    while (!pipe->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return pipe->committed || pipe->done; })) {
      if (req.is_connection_closed()) {  // the client left: so does the replica's connection
        pipe->client_gone = true;
        ++counters_->client_gone;
        return;
      }
    }
    if (!pipe->committed && !pipe->ok) {  // died before the first token: try the next replica
      pipe->client_gone = true;
      ++r.failures;
      r.healthy = false;
      excluded[choice->replica] = true;
      continue;
    }
    lock.unlock();
    Counters* counters = counters_.get();
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [pipe, counters, rp, in_flight](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> l(pipe->mu);
          pipe->cv.wait_for(l, std::chrono::seconds(1), [&] { return pipe->done || !pipe->chunks.empty(); });
          while (!pipe->chunks.empty()) {
            std::string c = std::move(pipe->chunks.front());
            pipe->chunks.pop_front();
            l.unlock();
            // skippy-server's last event says where the prefix came from.
            if (c.find("\"cache_tier\":\"shared\"") != std::string::npos) ++counters->shared_hits;
            if (!sink.write(c.data(), c.size())) return false;
            l.lock();
          }
          if (pipe->done) {
            if (!pipe->ok) {  // the replica died mid-stream: say so rather than end silently
              ++counters->streams_cut;
              ++rp->failures;
              const std::string e = StrCat(
                  "data: ", json{{"error", {{"message", "the replica serving this stream failed"}, {"type", "server_error"},
                                             {"code", "replica_failed"}}}}.dump(), "\n\n");
              l.unlock();
              sink.write(e.data(), e.size());
            }
            sink.done();
          }
          return true;
        },
        [pipe](bool) {
          std::lock_guard<std::mutex> l(pipe->mu);
          pipe->client_gone = true;
        });
    return;
  }
  ++counters_->unavailable;
  if (busy) return SendBusy(*busy, res);
  SendError(res, 503, "no_replica", "no replica could take the request");
}

void Router::Follow(Replica& r) {
  while (!stopping_) {
    httplib::Client c(r.host, r.port);
    c.set_connection_timeout(1);
    c.set_read_timeout(5);  // the replica writes a keepalive every second
    httplib::Headers h;
    if (!options_.replica_key.empty()) h.emplace("Authorization", "Bearer " + options_.replica_key);
    std::string buffer;
    auto got = c.Get("/cache/events", h, [&](const char* data, size_t n) {
      buffer.append(data, n);
      for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
        const std::string frame = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (!frame.starts_with("data: ")) continue;  // a keepalive comment
        const json e = json::parse(frame.substr(6), nullptr, false);
        // Read field by field: a replica's event of another shape is skipped, never thrown on.
        const auto kind = e.is_object() ? e.find("kind") : e.end();
        if (e.is_object() && kind != e.end() && kind->is_string() && kind->get<std::string>() == "hello") {
          const auto lanes = e.find("lanes");
          r.lanes = lanes != e.end() && lanes->is_number_integer()
                        ? static_cast<int>(std::clamp<int64_t>(lanes->get<int64_t>(), 1, 1 << 16))
                        : 1;
          r.follows = true;
        }
        r.view.Apply(e);
      }
      // An event never ends: the stream is not one a replica writes; reconnect.
      return !stopping_.load() && buffer.size() <= kMaxEventBytes;
    });
    r.follows = false;
    r.view.Clear();  // what it holds now is unknown
    const auto until = Clock::now() + (got && got->status == 404 ? std::chrono::seconds(5) : std::chrono::milliseconds(300));
    while (!stopping_ && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Router::HealthLoop() {
  while (!stopping_) {
    const auto next = Clock::now() + options_.health_interval;
    for (auto& r : replicas_) {
      httplib::Client c(r->host, r->port);
      c.set_connection_timeout(1);
      c.set_read_timeout(2);
      auto got = c.Get("/health");
      r->healthy = got && got->status == 200;
    }
    while (!stopping_ && Clock::now() < next) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

json Router::StatsJson() const {
  json reps = json::array();
  for (const auto& r : replicas_) {
    reps.push_back({{"replica", r->name},
                    {"healthy", r->healthy.load()},
                    {"following_events", r->follows.load()},
                    {"in_flight", r->in_flight.load()},
                    {"lanes", r->lanes.load()},
                    {"known_entries", r->view.entries()},
                    {"events", r->view.events()},
                    {"requests", r->requests.load()},
                    {"routed_by_prefix", r->by_prefix.load()},
                    {"routed_by_load", r->by_load.load()},
                    {"routed_round_robin", r->by_rr.load()},
                    {"failures", r->failures.load()},
                    {"matched_tokens", r->matched_tokens.load()}});
  }
  const Counters& c = *counters_;
  return {{"policy", options_.policy == Policy::kCacheAware ? "cache-aware" : "round-robin"},
          {"replicas", reps},
          {"requests", c.requests.load()},
          {"retries", c.retries.load()},
          {"unavailable", c.unavailable.load()},
          {"streams_cut", c.streams_cut.load()},
          {"client_gone", c.client_gone.load()},
          {"timeouts", c.timeouts.load()},
          {"busy_replicas", c.busy_replicas.load()},
          {"prompt_key_failures", c.prompt_key_failures.load()},
          {"shared_hits", c.shared_hits.load()},
          {"prompt_tokens", c.prompt_tokens.load()},
          {"in_flight", in_flight_.load()}};
}

std::string Router::MetricsText() const {
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    StrAppend(&o, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  head("skippy_router_requests_total", "counter", "Generation requests sent to a replica, by how it was chosen.");
  for (const auto& r : replicas_) {
    for (const auto& [by, n] : {std::pair{"prefix", r->by_prefix.load()}, std::pair{"load", r->by_load.load()},
                                std::pair{"round-robin", r->by_rr.load()}}) {
      StrAppend(&o, "skippy_router_requests_total{replica=\"", r->name, "\",routed_by=\"", by, "\"} ", n, "\n");
    }
  }
  head("skippy_router_replica_healthy", "gauge", "1 while the replica passes its health check.");
  for (const auto& r : replicas_) StrAppend(&o, "skippy_router_replica_healthy{replica=\"", r->name, "\"} ", r->healthy ? 1 : 0, "\n");
  head("skippy_router_replica_in_flight", "gauge", "Requests in flight at the replica (sent by this router).");
  for (const auto& r : replicas_) StrAppend(&o, "skippy_router_replica_in_flight{replica=\"", r->name, "\"} ", r->in_flight.load(), "\n");
  head("skippy_router_replica_failures_total", "counter", "Requests the replica failed to answer.");
  for (const auto& r : replicas_) StrAppend(&o, "skippy_router_replica_failures_total{replica=\"", r->name, "\"} ", r->failures.load(), "\n");
  head("skippy_router_replica_known_entries", "gauge", "Cache entries the router knows the replica holds.");
  for (const auto& r : replicas_) StrAppend(&o, "skippy_router_replica_known_entries{replica=\"", r->name, "\"} ", r->view.entries(), "\n");
  const Counters& c = *counters_;
  head("skippy_router_retries_total", "counter", "Requests sent again to another replica after a failure.");
  StrAppend(&o, "skippy_router_retries_total ", c.retries.load(), "\n");
  head("skippy_router_unavailable_total", "counter", "Requests answered 503: no replica could take them.");
  StrAppend(&o, "skippy_router_unavailable_total ", c.unavailable.load(), "\n");
  head("skippy_router_streams_cut_total", "counter", "Streams ended with an error event: the replica failed mid-stream.");
  StrAppend(&o, "skippy_router_streams_cut_total ", c.streams_cut.load(), "\n");
  head("skippy_router_client_gone_total", "counter", "Requests whose client left before the answer began (the replica's connection closed too).");
  StrAppend(&o, "skippy_router_client_gone_total ", c.client_gone.load(), "\n");
  head("skippy_router_timeouts_total", "counter", "Requests answered 504: a replica took longer than --read-timeout-secs.");
  StrAppend(&o, "skippy_router_timeouts_total ", c.timeouts.load(), "\n");
  head("skippy_router_busy_replicas_total", "counter", "Answers 503 from a replica (busy, loading, draining), sent on to another.");
  StrAppend(&o, "skippy_router_busy_replicas_total ", c.busy_replicas.load(), "\n");
  head("skippy_router_shared_tier_hits_total", "counter", "Answers whose prefix a replica fetched from the shared tier.");
  StrAppend(&o, "skippy_router_shared_tier_hits_total ", c.shared_hits.load(), "\n");
  head("skippy_router_prompt_key_failures_total", "counter", "Requests routed without knowing their prompt.");
  StrAppend(&o, "skippy_router_prompt_key_failures_total ", c.prompt_key_failures.load(), "\n");
  return o;
}

}  // namespace skippy::router
