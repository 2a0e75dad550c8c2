#include "skippy/bench/production.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "skippy/bench/model_server.h"
#include "skippy/bench/use_case_corpus.h"
#include "skippy/cache/family_policy.h"
#include "skippy/common/stats.h"
#include "skippy/common/strings.h"
#include "skippy/common/subprocess.h"
#include "skippy/zoo/zoo_spec.h"

#ifndef SKIPPY_LLAMA_COMMIT
#define SKIPPY_LLAMA_COMMIT "unknown"
#endif

namespace skippy::bench {

using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* const kDefaultBenchmarkPrompt =
    "You are a senior engineer reviewing a pull request. The change adds a cache in front of a slow "
    "service: requests with the same prefix reuse saved state instead of recomputing it. List the "
    "three most important questions to ask about correctness, memory limits and eviction.";

namespace {



std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string FirstLine(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      const size_t colon = line.find(':');
      std::string v = colon == std::string::npos ? line : line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return "";
}

// Runs skippy-correctness as a child with a timeout; returns its report (or an error report).
json Certify(const ProductionOptions& o, const std::string& model, const std::string& prompt, int32_t prefix,
             const fs::path& work, const std::string& tag) {
  const fs::path prompt_file = work / (tag + ".prompt.txt");
  const fs::path report = work / (tag + ".certify.json");
  const fs::path log = work / (tag + ".certify.log");
  std::ofstream(prompt_file) << prompt;
  fs::remove(report);
  std::vector<std::string> argv = {o.correctness_bin, "state-handoff", "--model", model, "--prompt-file",
                                   prompt_file.string(), "--prefix-token-count", std::to_string(prefix),
                                   "--cache-hit-repeats", std::to_string(o.cache_hit_repeats),
                                   "--runtime-lane-count", std::to_string(std::max<uint32_t>(o.runtime_lane_count, 1)),
                                   "--threads", std::to_string(o.threads), "--ctx-size", std::to_string(o.ctx_size),
                                   "--batch-size", std::to_string(o.batch_size), "--report-out", report.string()};
  argv.insert(argv.end(), {"--flash-attn", o.flash_attn ? "on" : "off"});
  if (o.borrow_resident_hits) argv.push_back("--borrow-resident-hits");
  if (o.cache_decoded_result_hits) argv.push_back("--cache-decoded-result-hits");
  if (o.hits_from_disk) argv.insert(argv.end(), {"--hits-from-disk", (work / (tag + ".disk")).string()});
  fs::remove(log);
  auto proc = Subprocess::Start(argv, log.string());
  if (!proc.ok()) return {{"status", "error"}, {"error", std::string(proc.status().message())}};
  const std::optional<int> rc = proc->Wait(std::chrono::seconds(o.correctness_timeout_secs));
  if (!rc) {
    proc->Stop();
    return {{"status", "timeout"}, {"error", StrCat("certifier did not finish within ", o.correctness_timeout_secs, " s")}};
  }
  json r = json::parse(ReadFile(report), nullptr, false);
  if (r.is_discarded() || !r.is_object()) {
    return {{"status", "error"}, {"exit_code", *rc}, {"error", StrCat("no report; log tail: ", TailOfFile(log.string(), 500))}};
  }
  r["exit_code"] = *rc;
  return r;
}

json Settings(const ProductionOptions& o) {
  return {{"threads", o.threads},         {"ctx_size", o.ctx_size},
          {"batch_size", o.batch_size},   {"flash_attn", o.flash_attn},
          {"runtime_lane_count", o.runtime_lane_count}, {"llama_parallel", o.llama_parallel},
          {"cache_hit_repeats", o.cache_hit_repeats},   {"llama_repeats", o.llama_repeats},
          {"rounds", o.rounds},
          {"n_predict", 1},               {"zoo_preset", o.model_dir.empty() ? o.zoo_preset : "real-gguf"},
          {"borrow_resident_hits", o.borrow_resident_hits},
          {"cache_decoded_result_hits", o.cache_decoded_result_hits}, {"hits_from_disk", o.hits_from_disk}};
}

std::string MarkdownTable(const json& rows) {
  std::string md =
      "| key | family | payload | prefix | use case | correctness | llama-server warm ms | Skippy hit ms | speedup | "
      "cache bytes | notes |\n|---|---|---|---:|---|---|---:|---:|---:|---:|---|\n";
  for (const json& r : rows) {
    auto num = [&](const char* k, int prec) -> std::string {
      return r.contains(k) && r[k].is_number() ? fmt::format("{:.{}f}", r[k].get<double>(), prec) : "-";
    };
    std::string notes;
    for (const auto& n : r.value("notes", json::array())) notes += (notes.empty() ? "" : "; ") + n.get<std::string>();
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.value("key", ""),
                      r.value("family", ""), r.value("payload", ""), r.value("prefix_tokens", 0),
                      r.value("use_case", "-"), r.value("correctness", ""), num("llama_server_warm_median_ms", 2),
                      num("skippy_hit_median_ms", 2), num("speedup", 2), r.value("cache_bytes", uint64_t{0}), notes);
  }
  return md;
}

}  // namespace

json MachineInfo() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return {{"hostname", host},
          {"nproc", std::thread::hardware_concurrency()},
          {"cpu", FirstLine("/proc/cpuinfo", "model name")},
          {"memory", FirstLine("/proc/meminfo", "MemTotal")},
          {"llama_cpp_commit", SKIPPY_LLAMA_COMMIT}};
}

StatusOr<json> RunProduction(const ProductionOptions& o) {
  if (o.output_dir.empty()) return absl::InvalidArgumentError("--output-dir is required");
  if (o.llama_repeats < 2) {
    return absl::InvalidArgumentError("--llama-repeats must be at least 2 (each round's first request is not timed)");
  }
  if (o.cache_hit_repeats < 1) return absl::InvalidArgumentError("--cache-hit-repeats must be at least 1");
  if (o.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (o.prefix_tokens.empty()) return absl::InvalidArgumentError("no prefix token counts");
  for (int32_t p : o.prefix_tokens) {
    if (p < 1 || p + 32 > o.ctx_size) {
      return absl::InvalidArgumentError(StrCat("prefix of ", p, " tokens does not fit --ctx-size ", o.ctx_size));
    }
  }
  if (o.correctness_bin.empty() || !fs::exists(o.correctness_bin)) {
    return absl::NotFoundError(StrCat("skippy-correctness not found at '", o.correctness_bin, "'"));
  }
  std::vector<const zoo::FamilySpec*> families;
  if (o.cases.empty()) {
    for (const zoo::FamilySpec& f : zoo::Families()) families.push_back(&f);
  } else {
    for (const std::string& key : o.cases) {
      SKIPPY_ASSIGN_OR_RETURN(const zoo::FamilySpec* f, zoo::FindFamily(key));
      families.push_back(f);
    }
  }
  std::vector<UseCase> use_cases;
  if (!o.use_case.empty()) {
    SKIPPY_ASSIGN_OR_RETURN(std::vector<UseCase> corpus, LoadUseCaseCorpus(o.use_case_corpus));
    SKIPPY_ASSIGN_OR_RETURN(use_cases, SelectUseCases(corpus, o.use_case));
  }
  std::error_code ec;
  fs::create_directories(fs::path(o.output_dir) / "work", ec);
  if (ec) return absl::InvalidArgumentError(StrCat("cannot create ", o.output_dir, ": ", ec.message()));
  const fs::path work = fs::path(o.output_dir) / "work";

  json doc = {{"version", 1},
              {"kind", use_cases.empty() ? "full-gguf" : "use-cases"},
              {"synthetic_weights", o.model_dir.empty()},
              {"zoo_preset", o.model_dir.empty() ? o.zoo_preset : ""},
              {"zoo_format", o.model_dir.empty() ? o.zoo_format : ""},
              {"machine", MachineInfo()},
              {"settings", Settings(o)},
              {"rows", json::array()}};
  if (!use_cases.empty()) {
    json uc = json::array();
    for (const UseCase& u : use_cases) {
      uc.push_back({{"key", u.key}, {"label", u.label}, {"prefix_tokens", u.prefix_tokens},
                    {"source", {{"dataset", u.dataset}, {"config", u.config}, {"split", u.split}, {"row_idx", u.row_idx}}}});
    }
    doc["use_cases"] = uc;
  }
  const fs::path json_path = fs::path(o.output_dir) / "production-cache-bench.json";
  const fs::path md_path = fs::path(o.output_dir) / "production-cache-bench.md";
  auto flush = [&] {
    std::ofstream(json_path) << doc.dump(2) << "\n";
    std::ofstream(md_path) << "# Production cache benchmark\n\n"
                           << (o.model_dir.empty() ? StrCat("Synthetic-weight models (skippy-zoo preset `", o.zoo_preset,
                                                            "`, weights ", o.zoo_format,
                                                            "); numbers describe speed, not model quality.\n\n")
                                                   : std::string("Real GGUF models.\n\n"))
                           << MarkdownTable(doc["rows"]);
  };
  flush();

  struct Job {
    int32_t prefix;
    const UseCase* use_case;
  };
  std::vector<Job> jobs;
  for (int32_t p : o.prefix_tokens) {
    if (use_cases.empty()) jobs.push_back({p, nullptr});
    for (const UseCase& u : use_cases) jobs.push_back({p == 128 && o.prefix_tokens.size() == 1 ? u.prefix_tokens : p, &u});
  }

  const size_t total = families.size() * jobs.size();
  size_t done = 0;
  const auto run_start = Clock::now();
  for (size_t fi = 0; fi < families.size(); ++fi) {
    const zoo::FamilySpec& f = *families[fi];
    const std::string key(f.key);
    const cache::FamilyRow& row = f.row();
    std::string model = o.model_dir.empty() ? StrCat(o.zoo_dir, "/", zoo::ZooFileName(f, o.zoo_format))
                                            : StrCat(o.model_dir, "/", key, ".gguf");
    // One llama-server per family, started when the first row needs it and kept for its rows.
    std::optional<ModelServer> server;
    std::string server_error;
    auto llama_server = [&]() -> ModelServer* {
      if (server) return &*server;
      if (!server_error.empty()) return nullptr;
      std::fprintf(stderr, "[bench] %s: starting llama-server for the baseline\n", key.c_str());
      ModelServerOptions lo = MatchedServerOptions(o, ServerKind::kLlamaServer, o.llama_server_bin, model,
                                                   o.llama_parallel, (work / StrCat(key, ".llama-server.log")).string());
      fs::remove(lo.log_path);
      auto started = ModelServer::Start(lo);
      if (!started.ok()) {
        server_error = std::string(started.status().message());
        return nullptr;
      }
      server.emplace(std::move(*started));
      return &*server;
    };
    for (const Job& job : jobs) {
      ++done;
      json r = {{"key", key},
                {"family", std::string(row.display_name)},
                {"model_path", model},
                {"model_ref", std::string(f.model_ref)},
                {"payload", std::string(cache::PayloadKindName(row.payload))},
                {"package_only", row.package_only},
                {"prefix_tokens", job.prefix},
                {"case", key},
                {"notes", json::array()},
                {"settings", Settings(o)}};
      if (job.use_case) {
        r["case"] = StrCat(key, "/", job.use_case->key);
        r["use_case"] = job.use_case->key;
        r["use_case_label"] = job.use_case->label;
        r["use_case_source"] = {{"dataset", job.use_case->dataset}, {"config", job.use_case->config},
                                {"split", job.use_case->split}, {"row_idx", job.use_case->row_idx}};
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      std::fprintf(stderr, "[bench] %zu/%zu %s prefix=%d%s: certify (%.0f s elapsed)\n", done, total, key.c_str(), job.prefix,
                   job.use_case ? StrCat(" use-case=", job.use_case->key).c_str() : "", elapsed);
      if (!fs::exists(model)) {
        r["status"] = "missing";
        r["correctness"] = "missing";
        r["notes"].push_back(StrCat("model file not found: ", model));
        doc["rows"].push_back(r);
        flush();
        continue;
      }
      const std::string tag = StrCat(key, "-p", job.prefix, job.use_case ? "-" + job.use_case->key : "");
      // Rounds: Skippy's hits (a certification each) and llama-server's requests take turns, which
      // goes first alternating from the second round on (the first certification gives the exact
      // prompt text llama-server is sent), so a drift of the machine's speed falls on both sides.
      std::vector<double> skippy_rounds, llama_rounds;
      json llama_runs = json::array();
      std::string failed;  // a certification that did not pass
      std::string llama_error;
      int llama_failed = 0, llama_not_reused = 0;
      auto skippy_round = [&](int round) {
        json cert = Certify(o, model, job.use_case ? job.use_case->prompt : kDefaultBenchmarkPrompt, job.prefix, work,
                            round == 0 ? tag : StrCat(tag, "-r", round));
        const std::string status = cert.value("status", "error");
        if (round == 0) r["skippy"] = cert;
        if (status != "pass") {
          failed = status;
          r["skippy_failed_round"] = round;
          if (round > 0) r["skippy_failed"] = cert;
          r["notes"].push_back(StrCat("certification ", status, round > 0 ? StrCat(" in round ", round + 1) : "", ": ",
                                      cert.value("reason", cert.value("error", std::string("logits differ")))));
          return;
        }
        skippy_rounds.push_back(cert.value("cache_hit_total_ms", 0.0));
      };
      auto llama_round = [&](int round) {
        ModelServer* ls = llama_server();
        if (ls == nullptr) return;
        const std::string text = r["skippy"].value("benchmark_prompt_text", std::string());
        std::vector<double> warm;
        for (int k = 0; k < o.llama_repeats; ++k) {
          CompletionRun run = ls->Complete(text, 1);
          llama_runs.push_back({{"round", round}, {"ok", run.ok}, {"client_ms", run.client_ms},
                                {"http_status", run.http_status}, {"timings", run.timings},
                                {"tokens_cached", run.tokens_cached}, {"tokens_evaluated", run.tokens_evaluated},
                                {"error", run.error}});
          if (!run.ok) {
            // A failed request has no time: the row is an error rather than a median of the rest.
            ++llama_failed;
            llama_error = run.error;
          }
          if (run.ok && k > 0) {
            warm.push_back(run.client_ms);
            if (run.timings.contains("cache_n") && run.timings.value("cache_n", 0) == 0) ++llama_not_reused;
          }
        }
        if (!warm.empty()) llama_rounds.push_back(Median(warm));
      };
      for (int round = 0; round < o.rounds && failed.empty(); ++round) {
        const bool llama_first = round % 2 == 1;
        if (llama_first && !o.skip_llama_server) llama_round(round);
        skippy_round(round);
        if (!failed.empty()) break;
        if (!llama_first && !o.skip_llama_server) llama_round(round);
      }
      const json& cert = r["skippy"];
      const std::string status = cert.value("status", "error");
      r["correctness"] = failed.empty() ? status : failed;
      if (cert.contains("model_identity")) {
        const json& id = cert["model_identity"];
        r["model_id"] = id.value("model_id", "");
        // A real GGUF is named by what it is, not by the family's model ref it may stand beside.
        if (!o.model_dir.empty()) {
          const std::string name = id.value("name", "");
          r["model_ref"] = StrCat(name.empty() ? fs::path(model).filename().string() : name, " (",
                                  id.value("weight_format", ""), ", real weights)");
        }
      }
      r["benchmark_prompt_token_count"] = cert.value("benchmark_prompt_token_count", 0);
      if (!failed.empty()) {
        r["status"] = failed;
        doc["rows"].push_back(r);
        flush();
        continue;
      }
      const double hit_ms = Median(skippy_rounds);
      r["skippy_hit_median_ms"] = hit_ms;
      r["skippy_hit_round_medians_ms"] = skippy_rounds;
      r["skippy_recompute_ms"] = cert.value("recompute_total_ms", 0.0);
      r["cache_bytes"] = cert.value("cache_storage_bytes", uint64_t{0});
      r["cache_bytes_method"] = "measured";
      if (!cert.value("benchmark_prompt_retokenizes_exactly", true)) {
        r["notes"].push_back("the benchmark text re-tokenizes differently; llama-server sees a slightly different prompt");
      }
      if (o.skip_llama_server) {
        r["llama_server"] = {{"status", "skipped"}};
        r["status"] = "skippy-only";
        r["notes"].push_back("llama-server skipped (--skip-llama-server)");
      } else if (!server_error.empty() && llama_rounds.empty()) {
        r["llama_server"] = {{"status", "error"}, {"error", server_error}, {"parallel", o.llama_parallel}};
        r["status"] = "llama-server-error";
        r["notes"].push_back(StrCat("llama-server failed: ", server_error));
      } else {
        json ls = {{"status", llama_rounds.empty() || llama_failed > 0 ? "error" : "ok"},
                   {"runs", llama_runs},
                   {"parallel", o.llama_parallel},
                   {"argv", server ? server->argv() : std::vector<std::string>{}}};
        if (llama_failed > 0) {
          r["status"] = "llama-server-error";
          r["notes"].push_back(StrCat(llama_failed, " llama-server request(s) failed: ", llama_error));
        } else if (!llama_rounds.empty()) {
          const double warm = Median(llama_rounds);
          ls["warm_median_ms"] = warm;
          ls["round_medians_ms"] = llama_rounds;
          r["llama_server_warm_median_ms"] = warm;
          r["speedup"] = warm / std::max(1e-6, hit_ms);
          r["status"] = "ok";
          if (llama_not_reused > 0) {
            // Its answer to a repeat of the prompt, as a user would get it; said so beside the ratio.
            r["notes"].push_back(StrCat("llama-server reused no prompt token in ", llama_not_reused, " of its ",
                                        o.rounds * (o.llama_repeats - 1), " warm requests"));
          }
        } else {
          r["status"] = "llama-server-error";
          r["notes"].push_back(StrCat("no successful warm llama-server request: ", llama_error));
        }
        r["llama_server"] = ls;
      }
      r["rounds"] = o.rounds;
      doc["rows"].push_back(r);
      flush();
    }
    if (server) server->Stop();
  }
  doc["elapsed_s"] = std::chrono::duration<double>(Clock::now() - run_start).count();
  flush();
  return doc;
}

}  // namespace skippy::bench
