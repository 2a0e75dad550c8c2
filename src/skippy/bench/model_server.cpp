#include "skippy/bench/model_server.h"

#include <fstream>

#include <filesystem>
#include <thread>

#include "httplib.h"
#include "skippy/common/stats.h"
#include "skippy/common/strings.h"

namespace skippy::bench {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const char* ServerName(const ModelServerOptions& o) {
  return o.kind == ServerKind::kLlamaServer ? "llama-server" : "skippy-server";
}

}  // namespace

uint64_t ModelServer::PeakRssBytes() const {
  std::ifstream in(StrCat("/proc/", process_.pid(), "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

StatusOr<ModelServer> ModelServer::Start(const ModelServerOptions& o) {
  if (o.binary.empty() || !std::filesystem::exists(o.binary)) {
    return absl::NotFoundError(StrCat("server binary not found: '", o.binary, "'"));
  }
  Status last = absl::UnavailableError("not started");
  for (int attempt = 0; attempt < 3; ++attempt) {  // a free port can be taken between probe and bind
    SKIPPY_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
    std::vector<std::string> argv = {o.binary, "-m", o.model_path, "--host", "127.0.0.1", "--port",
                                     std::to_string(port), "-t", std::to_string(o.threads), "--parallel",
                                     std::to_string(o.parallel), "-b", std::to_string(o.batch_size)};
    if (o.kind == ServerKind::kLlamaServer) {
      // llama-server's -c is the total over all slots; pin every setting it would otherwise choose.
      argv.insert(argv.end(), {"-c", std::to_string(o.ctx_size * o.parallel), "-ub", std::to_string(o.batch_size),
                               "-fa", o.flash_attn_auto ? "auto" : o.flash_attn ? "on" : "off", "--fit", "off", "--no-webui"});
    } else {
      // skippy-server's -c is per lane; flash attention is explicit (it has no auto).
      argv.insert(argv.end(), {"-c", std::to_string(o.ctx_size), "--flash-attn", o.flash_attn ? "on" : "off"});
    }
    argv.insert(argv.end(), o.extra_args.begin(), o.extra_args.end());
    const std::string log = o.log_path.empty() ? "/dev/null" : o.log_path;
    SKIPPY_ASSIGN_OR_RETURN(Subprocess proc, Subprocess::Start(argv, log));
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(1);
    client.set_read_timeout(5);
    const auto deadline = Clock::now() + o.startup_timeout;
    bool exited = false;
    while (Clock::now() < deadline) {
      if (auto rc = proc.Poll()) {
        exited = true;
        last = absl::UnavailableError(StrCat(ServerName(o), " exited early with status ", *rc, "; log tail: ",
                                             TailOfFile(log, 600)));
        break;
      }
      auto res = client.Get("/health");
      if (res && res->status == 200) return ModelServer(std::move(proc), port, std::move(argv), o);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!exited) {
      proc.Stop();
      return absl::DeadlineExceededError(StrCat(ServerName(o), " did not become healthy within ", o.startup_timeout.count(),
                                                " s; log tail: ", TailOfFile(log, 600)));
    }
    // An early exit on a taken port is worth one more try; anything else fails after 3 attempts.
  }
  return last;
}

CompletionRun ModelServer::Complete(const std::string& prompt, int n_predict, int n_probs) const {
  CompletionRun run;
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(static_cast<time_t>(options_.request_timeout.count()));
  json body = {{"prompt", prompt}, {"n_predict", n_predict}, {"temperature", 0}, {"cache_prompt", true}};
  if (n_probs > 0) body["n_probs"] = n_probs;
  const auto t0 = Clock::now();
  auto res = client.Post("/completion", body.dump(), "application/json");
  run.client_ms = MsSince(t0);
  if (!res) {
    run.error = StrCat("no response (", httplib::to_string(res.error()), ")");
    return run;
  }
  run.http_status = res->status;
  json j = json::parse(res->body, nullptr, false);
  if (res->status != 200 || j.is_discarded()) {
    run.error = StrCat("HTTP ", res->status, ": ", res->body.substr(0, 300));
    return run;
  }
  run.ok = true;
  run.timings = j.value("timings", json::object());
  run.tokens_cached = j.value("tokens_cached", -1);
  run.tokens_evaluated = j.value("tokens_evaluated", -1);
  run.content = j.value("content", std::string());
  if (j.contains("completion_probabilities") && j["completion_probabilities"].is_array()) {
    run.probabilities = j["completion_probabilities"];
  }
  return run;
}

StreamRun ModelServer::StreamComplete(const std::string& prompt, int n_predict, int n_probs) const {
  return StreamCompleteAt(port_, prompt, n_predict, n_probs, options_.request_timeout);
}

StreamRun StreamCompleteAt(int port, const std::string& prompt, int n_predict, int n_probs,
                           std::chrono::seconds timeout) {
  StreamRun run;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(static_cast<time_t>(timeout.count()));
  json body = {{"prompt", prompt}, {"n_predict", n_predict}, {"temperature", 0}, {"cache_prompt", true},
               {"stream", true}};
  if (n_probs > 0) {
    body["n_probs"] = n_probs;
    body["return_tokens"] = true;
  }
  const auto t0 = Clock::now();
  std::string buffer;
  bool first = true;
  double last_token_ms = 0;
  double first_event_ms = -1;  // any event: a stream can end without a token event
  httplib::Request req;
  req.method = "POST";
  req.path = "/completion";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      json j = json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (first_event_ms < 0) first_event_ms = MsSince(t0);
      if (j.contains("timings") && j["timings"].is_object()) run.timings = j["timings"];
      if (j.contains("skippy") && j["skippy"].is_object()) run.skippy = j["skippy"];
      if (j.contains("error")) run.error = j["error"].is_object() ? j["error"].value("message", j["error"].dump()) : j["error"].dump();
      if (j.value("stop", false)) {
        run.tokens_predicted = j.value("tokens_predicted", -1);
        run.stop_type = j.value("stop_type", std::string());
      }
      if (n_probs > 0 && !j.value("stop", false)) {
        for (const json& t : j.value("tokens", json::array())) run.token_ids.push_back(t.get<int64_t>());
        for (const json& p : j.value("completion_probabilities", json::array())) run.probabilities.push_back(p);
      }
      if (j.contains("content") && !j.value("stop", false)) {
        const double now_ms = MsSince(t0);
        if (first) {
          run.ttft_ms = now_ms;
          first = false;
        } else {
          run.max_gap_ms = std::max(run.max_gap_ms, now_ms - last_token_ms);
        }
        last_token_ms = now_ms;
        run.content += j.value("content", std::string());
        ++run.tokens;
      }
    }
    return true;
  };
  auto res = client.send(req);
  run.total_ms = MsSince(t0);
  if (!res || res->status != 200) {
    run.error = res ? StrCat("HTTP ", res->status) : StrCat("no response (", httplib::to_string(res.error()), ")");
    return run;
  }
  // Answered: the stream brought its events. One that ended before any token (an end of generation
  // first, or an error event in place of text) was answered when its first event came.
  run.ok = first_event_ms >= 0;
  if (!run.ok) run.error = "no events in the stream";
  if (run.ok && first) run.ttft_ms = first_event_ms;
  run.tpot_ms = run.tokens > 1 ? (run.total_ms - run.ttft_ms) / (run.tokens - 1) : 0.0;
  return run;
}

}  // namespace skippy::bench
