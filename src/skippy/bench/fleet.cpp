#include "skippy/bench/fleet.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "httplib.h"
#include "skippy/bench/model_server.h"
#include "skippy/bench/production.h"
#include "skippy/common/stats.h"
#include "skippy/common/strings.h"
#include "skippy/common/subprocess.h"
#include "skippy/zoo/zoo_spec.h"

namespace skippy::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kRedisPassword = "skippy-fleet-bench";

std::string Which(const std::string& bin) {
  if (bin.find('/') != std::string::npos) return bin;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t at = 0; at <= dirs.size();) {
    const size_t colon = std::min(dirs.find(':', at), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(at, colon - at)) / bin;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    at = colon + 1;
  }
  return bin;
}

// redis-server on a loopback port (fixed once chosen: Restart keeps it), password, no persistence.
class Redis {
 public:
  static StatusOr<std::unique_ptr<Redis>> Start(const std::string& bin, const fs::path& log) {
    SKIPPY_ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
    auto r = std::unique_ptr<Redis>(new Redis(Which(bin), port, log.string()));
    SKIPPY_RETURN_IF_ERROR(r->Launch());
    return r;
  }
  int port() const { return port_; }
  void Kill() {
    if (proc_) {
      ::kill(proc_->pid(), SIGKILL);
      proc_->Stop(std::chrono::milliseconds(1000));
      proc_.reset();
    }
  }
  Status Restart() {
    Kill();
    return Launch();
  }
  ~Redis() { Kill(); }

 private:
  Redis(std::string bin, int port, std::string log) : bin_(std::move(bin)), port_(port), log_(std::move(log)) {}
  bool Ping() const {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, timeval{1, 0});
    bool ok = false;
    if (c != nullptr && c->err == 0) {
      if (auto* a = static_cast<redisReply*>(redisCommand(c, "AUTH %s", kRedisPassword))) freeReplyObject(a);
      if (auto* p = static_cast<redisReply*>(redisCommand(c, "PING"))) {
        ok = p->type == REDIS_REPLY_STATUS && std::string_view(p->str, p->len) == "PONG";
        freeReplyObject(p);
      }
    }
    if (c != nullptr) redisFree(c);
    return ok;
  }
  Status Launch() {
    SKIPPY_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start({bin_, "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                                             "--requirepass", kRedisPassword, "--save", "", "--appendonly",
                                                             "no", "--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru"},
                                                            log_));
    proc_ = std::make_unique<Subprocess>(std::move(p));
    for (int i = 0; i < 200; ++i) {
      if (Ping()) return absl::OkStatus();
      if (proc_->Poll()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return absl::UnavailableError(StrCat("redis-server did not start: ", TailOfFile(log_)));
  }
  std::string bin_;
  int port_;
  std::string log_;
  std::unique_ptr<Subprocess> proc_;
};

// skippy-router over `ports`; healthy (and following events, for cache-aware) before it returns.
class Router {
 public:
  static StatusOr<std::unique_ptr<Router>> Start(const std::string& bin, const std::vector<int>& ports, bool cache_aware,
                                                 const fs::path& log) {
    SKIPPY_ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
    std::vector<std::string> argv = {bin, "--port", std::to_string(port), "--policy",
                                     cache_aware ? "cache-aware" : "round-robin"};
    for (int p : ports) argv.insert(argv.end(), {"--replica", StrCat("127.0.0.1:", p)});
    SKIPPY_ASSIGN_OR_RETURN(Subprocess proc, Subprocess::Start(argv, log.string()));
    auto r = std::unique_ptr<Router>(new Router(std::make_unique<Subprocess>(std::move(proc)), port));
    for (int i = 0; i < 400; ++i) {
      const json s = r->Stats();
      bool ready = s.contains("replicas");
      for (const json& rep : s.value("replicas", json::array())) {
        ready = ready && rep.value("healthy", false) && (!cache_aware || rep.value("following_events", false));
      }
      if (ready) return r;
      if (r->proc_->Poll()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::UnavailableError(StrCat("skippy-router did not see its replicas: ", TailOfFile(log.string())));
  }
  int port() const { return port_; }
  json Stats() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(1);
    auto r = c.Get("/router/stats");
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json::object();
  }
  ~Router() { proc_->Stop(std::chrono::milliseconds(5000)); }

 private:
  Router(std::unique_ptr<Subprocess> p, int port) : proc_(std::move(p)), port_(port) {}
  std::unique_ptr<Subprocess> proc_;
  int port_;
};

struct Side {
  std::unique_ptr<Redis> redis;
  std::vector<std::unique_ptr<ModelServer>> servers;
  std::unique_ptr<Router> router;
};

ModelServerOptions ServerOpts(const FleetOptions& o, bool skippy, const std::string& model, const fs::path& log) {
  ModelServerOptions so;
  so.kind = skippy ? ServerKind::kSkippyServer : ServerKind::kLlamaServer;
  so.binary = skippy ? o.skippy_server_bin : o.llama_server_bin;
  so.model_path = model;
  so.ctx_size = o.ctx_size;
  so.threads = o.threads;
  so.parallel = 1;
  so.batch_size = o.batch_size;
  so.flash_attn = o.flash_attn;
  so.startup_timeout = std::chrono::seconds(o.server_startup_timeout_secs);
  so.request_timeout = std::chrono::seconds(o.request_timeout_secs);
  so.log_path = log.string();
  return so;
}

StatusOr<std::unique_ptr<ModelServer>> StartReplica(const FleetOptions& o, bool skippy, const std::string& model,
                                                    const fs::path& log, const Redis* redis, const fs::path& pw_file) {
  ModelServerOptions so = ServerOpts(o, skippy, model, log);
  if (skippy && redis != nullptr) {
    so.extra_args = {"--shared-redis", StrCat("127.0.0.1:", redis->port()), "--shared-redis-password-file", pw_file.string()};
    if (o.replica_cache_mib > 0) so.extra_args.insert(so.extra_args.end(), {"--cache-ram", std::to_string(o.replica_cache_mib)});
  }
  SKIPPY_ASSIGN_OR_RETURN(ModelServer s, ModelServer::Start(so));
  return std::make_unique<ModelServer>(std::move(s));
}

StatusOr<Side> StartSide(const FleetOptions& o, bool skippy, const std::string& model, const fs::path& work,
                         const std::string& tag, const fs::path& pw_file) {
  Side side;
  if (skippy) {
    SKIPPY_ASSIGN_OR_RETURN(side.redis, Redis::Start(o.redis_server_bin, work / (tag + "-redis.log")));
  }
  std::vector<int> ports;
  for (int i = 0; i < o.replicas; ++i) {
    SKIPPY_ASSIGN_OR_RETURN(auto s, StartReplica(o, skippy, model, work / StrCat(tag, "-replica", i, ".log"),
                                                 side.redis.get(), pw_file));
    ports.push_back(s->port());
    side.servers.push_back(std::move(s));
  }
  SKIPPY_ASSIGN_OR_RETURN(side.router, Router::Start(o.skippy_router_bin, ports, skippy, work / (tag + "-router.log")));
  return side;
}

struct Result {
  bool ok = false;
  std::string error;
  double ttft_ms = 0;
  int cache_n = 0;
  int prompt_n = 0;
  std::string content;
};

// Sends the workload to `port` from `clients` threads: the streams (documents, conversations) are
// dealt to clients in order of first appearance; each client sends its streams' requests in
// workload order. `after_each(done)` runs after every answer (fault injection).
std::vector<Result> Drive(int port, const Workload& w, int clients, std::chrono::seconds timeout,
                          const std::function<void(size_t)>& after_each = nullptr) {
  std::map<std::string, int> owner;
  for (const WorkloadRequest& r : w.requests) {
    if (!owner.count(r.stream)) owner[r.stream] = static_cast<int>(owner.size()) % std::max(1, clients);
  }
  std::vector<Result> out(w.requests.size());
  std::atomic<size_t> done{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (size_t i = 0; i < w.requests.size(); ++i) {
        if (owner[w.requests[i].stream] != c) continue;
        const StreamRun run = StreamCompleteAt(port, w.requests[i].prompt, w.requests[i].n_predict, 0, timeout);
        Result& r = out[i];
        r.ok = run.served();
        r.error = run.error;
        r.ttft_ms = run.ttft_ms;
        r.cache_n = run.timings.value("cache_n", 0);
        r.prompt_n = run.timings.value("prompt_n", 0);
        r.content = run.content;
        const size_t n = ++done;
        if (after_each) after_each(n);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

json Summary(const std::vector<Result>& rs) {
  std::vector<double> ttft;
  int64_t reused = 0, prompt = 0;
  int errors = 0;
  for (const Result& r : rs) {
    if (!r.ok) {
      ++errors;
      continue;
    }
    ttft.push_back(r.ttft_ms);
    reused += r.cache_n;
    prompt += r.cache_n + r.prompt_n;
  }
  return {{"requests", rs.size()}, {"errors", errors}, {"ttft_p50_ms", Median(ttft)}, {"ttft_p95_ms", Percentile(ttft, 0.95)},
          {"prompt_tokens", prompt}, {"reused_tokens", reused}};
}

// Where the skippy replicas' hits came from, summed over the fleet (their /cache/stats).
json ReplicaHits(const Side& side) {
  json sum = {{"lane_hits", 0}, {"stored_hits", 0}, {"recurrent_onto_hits", 0}, {"shared_hits", 0}, {"disk_hits", 0}};
  for (const auto& s : side.servers) {
    httplib::Client c("127.0.0.1", s->port());
    c.set_connection_timeout(1);
    auto r = c.Get("/cache/stats");
    if (!r || r->status != 200) continue;
    const json j = json::parse(r->body, nullptr, false);
    if (!j.is_object()) continue;
    for (auto it = sum.begin(); it != sum.end(); ++it) *it = it->get<int64_t>() + j.value(it.key(), int64_t{0});
  }
  return sum;
}

json ResultsJson(const Workload& w, const std::vector<Result>& rs) {
  json a = json::array();
  for (size_t i = 0; i < rs.size(); ++i) {
    a.push_back({{"i", i}, {"stream", w.requests[i].stream}, {"ok", rs[i].ok}, {"error", rs[i].error},
                 {"ttft_ms", rs[i].ttft_ms}, {"cache_n", rs[i].cache_n}, {"prompt_n", rs[i].prompt_n}});
  }
  return a;
}

// The answers a single skippy-server gives, sequentially, with a cache holding everything: the
// reference for reuse and for every fleet answer.
StatusOr<std::vector<Result>> Reference(const FleetOptions& o, const std::string& model, const Workload& w,
                                        const fs::path& log) {
  ModelServerOptions so = ServerOpts(o, true, model, log);
  so.extra_args = {"--cache-ram", "8192"};
  SKIPPY_ASSIGN_OR_RETURN(ModelServer s, ModelServer::Start(so));
  return Drive(s.port(), w, 1, std::chrono::seconds(o.request_timeout_secs));
}

// Prompt up to its last "Question: " (interleaved-prefixes): the document part.
std::string DocumentPart(const std::string& prompt) { return prompt.substr(0, prompt.rfind("Question: ")); }

std::string Markdown(const json& doc) {
  std::string md = StrCat("# skippy-bench fleet\n\n", doc["settings"].value("replicas", 0),
                          " replicas, 1 lane and ", doc["settings"].value("threads", 0),
                          " thread(s) each; Skippy: skippy-server on a shared Redis tier behind skippy-router "
                          "(cache-aware); baseline: llama-server behind skippy-router --policy round-robin. ",
                          doc.value("synthetic_weights", true) ? "Synthetic weights. " : "",
                          "TTFT medians in ms (the client's first streamed token).\n\n",
                          "| workload | Skippy TTFT p50 | llama-server TTFT p50 | ratio | Skippy reused | one-replica reused | "
                          "fleet/one | errors (Skippy, llama) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  for (const json& r : doc["workloads"]) {
    const json& s = r["skippy"];
    const json& l = r["llama"];
    md += StrCat("| ", r.value("workload", ""), " | ", fmt::format("{:.1f}", s.value("ttft_p50_ms", 0.0)), " | ",
                 fmt::format("{:.1f}", l.value("ttft_p50_ms", 0.0)), " | ", fmt::format("{:.2f}x", r.value("ttft_ratio", 0.0)),
                 " | ", s.value("reused_tokens", 0), " | ", r["reference"].value("reused_tokens", 0), " | ",
                 fmt::format("{:.2f}", r.value("reuse_vs_one_replica", 0.0)), " | ", s.value("errors", 0), ", ",
                 l.value("errors", 0), " |\n");
  }
  md += "\nWhere the Skippy replicas' hits came from (lane: a replica's own last prompt; memory: its RAM, a hybrid's "
        "recurrent state restored onto its lane included; shared: fetched from Redis, computed by another replica):\n\n| workload | lane | memory | shared |\n| --- | ---: | ---: | ---: |\n";
  for (const json& r : doc["workloads"]) {
    const json h = r["skippy"].value("replica_hits", json::object());
    md += StrCat("| ", r.value("workload", ""), " | ", h.value("lane_hits", 0), " | ",
                 h.value("stored_hits", 0) + h.value("recurrent_onto_hits", 0) - h.value("shared_hits", 0), " | ",
                 h.value("shared_hits", 0), " |\n");
  }
  if (doc.contains("restart") && doc["restart"].is_object()) {
    const json& r = doc["restart"];
    md += StrCat("\n## A restarted replica\n\nFirst hits on documents recorded before the restart (from the shared "
                 "tier) against hits from the replica's own RAM, asked directly: ",
                 fmt::format("{:.1f}", r.value("shared_ttft_p50_ms", 0.0)), " vs ",
                 fmt::format("{:.1f}", r.value("ram_ttft_p50_ms", 0.0)), " ms (",
                 fmt::format("{:.2f}x", r.value("shared_over_ram", 0.0)), "); a cold prompt on it: ",
                 fmt::format("{:.1f}", r.value("cold_ttft_p50_ms", 0.0)), " ms.\n");
  }
  if (doc.contains("faults") && doc["faults"].is_object()) {
    const json& f = doc["faults"];
    md += StrCat("\n## Faults\n\nRedis killed after a third of the requests and started again (empty) 2 s later; a "
                 "replica killed after two thirds. Requests: ", f.value("requests", 0), ", answered: ",
                 f.value("answered", 0), ", different from the single server's answer: ", f.value("wrong", 0),
                 ", failed (counted): ", f.value("failed", 0), "; router retries ", f["router"].value("retries", 0),
                 ", streams cut ", f["router"].value("streams_cut", 0), ", unavailable ",
                 f["router"].value("unavailable", 0), ".\n");
  }
  return md;
}

}  // namespace

StatusOr<json> RunFleet(const FleetOptions& o) {
  if (o.replicas < 1 || o.replicas > 8) return absl::InvalidArgumentError("replicas must be 1-8");
  if (o.repeats < 1) return absl::InvalidArgumentError("--repeats must be at least 1");
  const fs::path out(o.output_dir);
  const fs::path work = out / "work";
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) return absl::InvalidArgumentError(StrCat("cannot create ", o.output_dir));
  std::string model = StrCat(o.model_dir, "/", o.case_key, ".gguf");
  if (o.model_dir.empty()) {
    SKIPPY_ASSIGN_OR_RETURN(const zoo::FamilySpec* family, zoo::FindFamily(o.case_key));
    model = StrCat(o.zoo_dir, "/", zoo::ZooFileName(*family, o.zoo_format));
  }
  const fs::path pw_file = work / "redis.password";
  std::ofstream(pw_file) << kRedisPassword << "\n";
  const auto timeout = std::chrono::seconds(o.request_timeout_secs);
  json doc = {{"version", 1}, {"machine", MachineInfo()}, {"synthetic_weights", o.model_dir.empty()},
              {"settings", {{"case", o.case_key}, {"replicas", o.replicas}, {"threads", o.threads}, {"ctx_size", o.ctx_size},
                            {"flash_attn", o.flash_attn}, {"replica_cache_mib", o.replica_cache_mib},
                            {"zoo_format", o.model_dir.empty() ? o.zoo_format : ""}, {"seed", o.workload.seed},
                            {"documents", o.workload.documents}, {"long_prefix_words", o.workload.long_prefix_words}}},
              {"workloads", json::array()}};
  auto flush = [&] {
    std::ofstream(out / "fleet.json") << doc.dump(2) << "\n";
    std::ofstream(out / "fleet.md") << Markdown(doc);
  };
  for (const std::string& name : o.workloads) {
    SKIPPY_ASSIGN_OR_RETURN(const Workload w, MakeWorkload(name, o.workload));
    if (w.has_replies()) {
      return absl::InvalidArgumentError(StrCat("workload '", name, "' sends each server's own replies back; the fleet "
                                               "benchmark compares answers to fixed prompts"));
    }
    std::fprintf(stderr, "[fleet] %s: reference (one replica holding everything)\n", name.c_str());
    SKIPPY_ASSIGN_OR_RETURN(const std::vector<Result> ref, Reference(o, model, w, work / (name + "-reference.log")));
    json row = {{"workload", name}, {"reference", Summary(ref)}};
    for (const bool skippy : {true, false}) {
      std::vector<json> reps;
      for (int rep = 0; rep < o.repeats; ++rep) {
        const std::string tag = StrCat(name, skippy ? "-skippy" : "-llama", rep);
        std::fprintf(stderr, "[fleet] %s: %s fleet, repeat %d\n", name.c_str(), skippy ? "skippy" : "llama-server", rep);
        SKIPPY_ASSIGN_OR_RETURN(Side side, StartSide(o, skippy, model, work, tag, pw_file));
        const std::vector<Result> rs = Drive(side.router->port(), w, o.replicas, timeout);
        json s = Summary(rs);
        int wrong = 0;
        for (size_t i = 0; i < rs.size(); ++i) wrong += rs[i].ok && ref[i].ok && rs[i].content != ref[i].content;
        s["differs_from_reference"] = wrong;
        s["router"] = side.router->Stats();
        if (skippy) s["replica_hits"] = ReplicaHits(side);
        s["results"] = ResultsJson(w, rs);
        if (skippy && name == "interleaved-prefixes" && rep == 0) {
          // A replica restarted: fresh questions on old documents, first from the shared tier, then from its RAM.
          std::fprintf(stderr, "[fleet] restart: replica 0 stopped and started again\n");
          side.servers[0]->Stop();
          SKIPPY_ASSIGN_OR_RETURN(side.servers[0], StartReplica(o, true, model, work / (tag + "-replica0-restarted.log"),
                                                                side.redis.get(), pw_file));
          std::vector<double> shared, ram, cold;
          const int docs = std::min(o.workload.documents, 4);
          for (int pass = 0; pass < 2; ++pass) {
            for (int d = 0; d < docs; ++d) {
              const std::string prompt = DocumentPart(w.requests[static_cast<size_t>(d)].prompt) +
                                         StrCat("Question: what does part ", pass, " of document ", d, " say?\nAnswer:");
              const StreamRun r = side.servers[0]->StreamComplete(prompt, 4);
              if (r.served() && r.tokens > 0 && r.timings.value("cache_n", 0) > 0) {
                (pass == 0 ? shared : ram).push_back(r.ttft_ms);
              }
            }
          }
          for (int d = 0; d < 2; ++d) {
            const StreamRun r = side.servers[0]->StreamComplete(StrCat("Fresh document ", d, ": ",
                                                                       DocumentPart(w.requests[0].prompt).substr(20)) + "\nAnswer:", 4);
            if (r.served() && r.tokens > 0) cold.push_back(r.ttft_ms);
          }
          doc["restart"] = {{"shared_ttft_p50_ms", Median(shared)}, {"ram_ttft_p50_ms", Median(ram)},
                            {"cold_ttft_p50_ms", Median(cold)}, {"shared_hits", shared.size()}, {"ram_hits", ram.size()},
                            {"shared_over_ram", Median(ram) > 0 ? Median(shared) / Median(ram) : 0.0},
                            {"shared_ttft_ms", shared}, {"ram_ttft_ms", ram}};
        }
        reps.push_back(std::move(s));
      }
      // The median repeat by TTFT p50 (of an even count, the slower of the two middle ones).
      std::sort(reps.begin(), reps.end(), [](const json& a, const json& b) { return a["ttft_p50_ms"] < b["ttft_p50_ms"]; });
      row[skippy ? "skippy" : "llama"] = reps[reps.size() / 2];
    }
    const double sp = row["skippy"].value("ttft_p50_ms", 0.0), lp = row["llama"].value("ttft_p50_ms", 0.0);
    row["ttft_ratio"] = sp > 0 ? lp / sp : 0.0;
    const double one = row["reference"].value("reused_tokens", 0.0);
    row["reuse_vs_one_replica"] = one > 0 ? row["skippy"].value("reused_tokens", 0.0) / one : 0.0;
    doc["workloads"].push_back(row);
    flush();
    if (o.faults && name == "interleaved-prefixes") {
      std::fprintf(stderr, "[fleet] faults: Redis and a replica killed mid-run\n");
      SKIPPY_ASSIGN_OR_RETURN(Side side, StartSide(o, true, model, work, name + "-faults", pw_file));
      const size_t n = w.requests.size();
      std::once_flag redis_once, replica_once;
      std::thread restarter;
      const pid_t victim = side.servers.back()->pid();
      const std::vector<Result> rs = Drive(side.router->port(), w, o.replicas, timeout, [&](size_t done) {
        if (done >= n / 3) {
          std::call_once(redis_once, [&] {
            side.redis->Kill();
            restarter = std::thread([&] {
              std::this_thread::sleep_for(std::chrono::seconds(2));
              (void)side.redis->Restart();
            });
          });
        }
        if (done >= 2 * n / 3) std::call_once(replica_once, [&] { ::kill(victim, SIGKILL); });
      });
      if (restarter.joinable()) restarter.join();
      int answered = 0, wrong = 0;
      for (size_t i = 0; i < rs.size(); ++i) {
        answered += rs[i].ok;
        wrong += rs[i].ok && ref[i].ok && rs[i].content != ref[i].content;
      }
      doc["faults"] = {{"requests", rs.size()}, {"answered", answered}, {"failed", static_cast<int>(rs.size()) - answered},
                       {"wrong", wrong}, {"router", side.router->Stats()}, {"results", ResultsJson(w, rs)}};
      flush();
    }
  }
  flush();
  return doc;
}

}  // namespace skippy::bench
