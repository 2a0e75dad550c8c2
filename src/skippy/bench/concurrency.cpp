#include "skippy/bench/concurrency.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "skippy/bench/model_server.h"
#include "skippy/common/stats.h"
#include "skippy/common/strings.h"
#include "skippy/zoo/zoo_spec.h"

namespace skippy::bench {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {


}  // namespace

Status CheckConcurrencySweep(const ProductionOptions& o) {
  if (o.concurrency_sweep.empty()) return absl::InvalidArgumentError("empty --concurrency-sweep");
  for (int c : o.concurrency_sweep) {
    if (c < 1 || c > 64) return absl::InvalidArgumentError(StrCat("concurrency level ", c, " outside [1, 64]"));
  }
  if (o.concurrent_requests < 1) return absl::InvalidArgumentError("--concurrent-requests must be at least 1");
  return absl::OkStatus();
}

StatusOr<json> RunConcurrencySweep(const ProductionOptions& o) {
  SKIPPY_RETURN_IF_ERROR(CheckConcurrencySweep(o));
  std::vector<std::string> keys = o.cases;
  if (keys.empty()) keys = {"llama"};
  json doc = {{"version", 1}, {"server", "llama-server"}, {"machine", MachineInfo()},
              {"ttft_slo_ms", o.ttft_slo_ms}, {"tpot_slo_ms", o.tpot_slo_ms}, {"n_predict", o.sweep_n_predict},
              {"requests_per_level", o.concurrent_requests}, {"synthetic_weights", o.model_dir.empty()},
              {"zoo_format", o.model_dir.empty() ? o.zoo_format : ""},
              {"results", json::array()}};
  const fs::path out = fs::path(o.output_dir) / "concurrency-sweep.json";
  for (const std::string& key : keys) {
    SKIPPY_ASSIGN_OR_RETURN(const zoo::FamilySpec* f, zoo::FindFamily(key));
    // The production rows' model: the zoo file in --zoo-format, or the real GGUF.
    const std::string model = o.model_dir.empty() ? StrCat(o.zoo_dir, "/", zoo::ZooFileName(*f, o.zoo_format))
                                                  : StrCat(o.model_dir, "/", key, ".gguf");
    for (int c : o.concurrency_sweep) {
      std::fprintf(stderr, "[bench] concurrency sweep %s: %d client(s)\n", key.c_str(), c);
      // ctx_size is per slot; ModelServer multiplies it for llama-server.
      ModelServerOptions lo = MatchedServerOptions(o, ServerKind::kLlamaServer, o.llama_server_bin, model, c, "");
      json level = {{"family", key}, {"concurrency", c}};
      auto server = ModelServer::Start(lo);
      if (!server.ok()) {
        level["status"] = "error";
        level["error"] = std::string(server.status().message());
        doc["results"].push_back(level);
        std::ofstream(out) << doc.dump(2) << "\n";
        continue;
      }
      std::vector<StreamRun> runs(static_cast<size_t>(o.concurrent_requests));
      std::atomic<int> next{0};
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> threads;
      for (int t = 0; t < c; ++t) {
        threads.emplace_back([&] {
          for (int i; (i = next.fetch_add(1)) < o.concurrent_requests;) {
            runs[static_cast<size_t>(i)] =
                server->StreamComplete(StrCat(kDefaultBenchmarkPrompt, " Request ", i, ": answer briefly."), o.sweep_n_predict);
          }
        });
      }
      for (auto& th : threads) th.join();
      const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      server->Stop();
      std::vector<double> ttft, tpot;
      int ok = 0, served = 0, good = 0;
      json reqs = json::array();
      for (const StreamRun& r : runs) {
        reqs.push_back({{"ok", r.ok}, {"ttft_ms", r.ttft_ms}, {"tpot_ms", r.tpot_ms}, {"tokens", r.tokens},
                        {"total_ms", r.total_ms}, {"error", r.error}});
        if (!r.ok) continue;
        ++ok;
        ttft.push_back(r.ttft_ms);
        if (r.tokens > 1) tpot.push_back(r.tpot_ms);  // a one-token answer has no time per output token
        if (!r.served()) continue;
        ++served;
        if (r.ttft_ms <= o.ttft_slo_ms && r.tpot_ms <= o.tpot_slo_ms) ++good;
      }
      level["status"] = ok == o.concurrent_requests ? "ok" : "partial";
      level["requests"] = reqs;
      level["ok_requests"] = ok;
      level["wall_s"] = wall_s;
      level["ttft_p50_ms"] = Percentile(ttft, 0.5);
      level["ttft_p95_ms"] = Percentile(ttft, 0.95);
      level["tpot_p50_ms"] = Percentile(tpot, 0.5);
      level["tpot_p95_ms"] = Percentile(tpot, 0.95);
      level["errors"] = ok - served;
      level["throughput_rps"] = served / wall_s;
      level["goodput_rps"] = good / wall_s;
      level["slo_attainment"] = static_cast<double>(good) / o.concurrent_requests;
      doc["results"].push_back(level);
      std::ofstream(out) << doc.dump(2) << "\n";
    }
  }
  return doc;
}

}  // namespace skippy::bench
