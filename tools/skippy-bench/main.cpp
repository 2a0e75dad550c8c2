// skippy-bench: the family benchmark against llama-server and the README report.
//
//   skippy-bench production --output-dir OUT [--case KEY ...] [--use-case NAME|all] ...
//   skippy-bench report --input A.json [--input B.json ...] --output readme-tables.md
//   skippy-bench serve-compare --output-dir OUT [--case KEY ...] [--workload NAME ...] [--lanes N]
//
// Exit codes: 0 done (per-case failures are rows with a status), 2 bad input, 4 internal error.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "skippy/bench/concurrency.h"
#include "skippy/bench/production.h"
#include "skippy/bench/report.h"
#include "skippy/bench/fleet.h"
#include "skippy/bench/serve_compare.h"
#include "skippy/zoo/zoo_spec.h"

namespace fs = std::filesystem;

namespace {

fs::path SelfDir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : p.parent_path();
}

std::string DefaultCacheDir() {
  if (const char* v = std::getenv("SKIPPY_CACHE_DIR")) return v;
  if (const char* v = std::getenv("XDG_CACHE_HOME")) return std::string(v) + "/skippy";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/skippy";
}

std::vector<int32_t> ParseIntList(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    const int v = std::stoi(item, &used);
    if (used != item.size()) throw CLI::ValidationError("list", "not an integer: " + item);
    out.push_back(v);
  }
  return out;
}

// --zoo-format as skippy-zoo takes it (any case), given back as the zoo spells its file names.
std::string ZooFormatOption(const std::string& name) {
  auto format = skippy::zoo::ParseZooFormat(name);
  if (!format.ok()) throw CLI::ValidationError(std::string(format.status().message()));
  return *std::move(format);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "skippy-bench: %s\n", std::string(s.message()).c_str());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return 2;
    default:
      return 4;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"skippy-bench: Skippy vs llama-server, family by family, and the README report"};
  app.require_subcommand(1);

  skippy::bench::ProductionOptions o;
  o.correctness_bin = (SelfDir() / "skippy-correctness").string();
  o.llama_server_bin = (SelfDir() / "llama-server").string();
  if (const char* stage = std::getenv("LLAMA_STAGE_BUILD_DIR")) o.llama_server_bin = std::string(stage) + "/bin/llama-server";
  o.use_case_corpus = SKIPPY_DEFAULT_CORPUS;
  std::string prefix_tokens = "128", sweep, concurrency;
  CLI::App* prod = app.add_subcommand("production", "certify and benchmark each family against llama-server");
  prod->add_option("--output-dir", o.output_dir, "where production-cache-bench.json/.md go")->required();
  prod->add_option("--case", o.cases, "family key (repeatable); default: every family");
  prod->add_option("--runtime-lane-count", o.runtime_lane_count, "Skippy lanes")->capture_default_str();
  prod->add_option("--llama-parallel", o.llama_parallel, "llama-server --parallel")->capture_default_str();
  prod->add_option("--prefix-tokens", prefix_tokens, "prefix tokens")->capture_default_str();
  prod->add_option("--prefix-token-sweep", sweep, "comma-separated prefix lengths, e.g. 128,512");
  prod->add_option("--use-case", o.use_case, "a use-case key or 'all'");
  prod->add_option("--use-case-corpus", o.use_case_corpus, "corpus JSON")->capture_default_str();
  prod->add_option("--cache-hit-repeats", o.cache_hit_repeats, "Skippy cache hits per row")->capture_default_str();
  prod->add_option("--llama-repeats", o.llama_repeats, "llama-server requests per row")->capture_default_str();
  prod->add_option("--rounds", o.rounds,
                   "alternating rounds of both sides per row (a certification with its hits, then llama-server's "
                   "requests; llama-server first in every second round); a row's numbers are the medians of the "
                   "rounds' medians")
      ->capture_default_str()->check(CLI::Range(1, 99));
  prod->add_flag("--skip-llama-server", o.skip_llama_server, "certify and time Skippy only");
  prod->add_option("--llama-server-bin", o.llama_server_bin, "llama-server binary")->capture_default_str();
  prod->add_option("--correctness-bin", o.correctness_bin, "skippy-correctness binary")->capture_default_str();
  prod->add_flag("--borrow-resident-hits", o.borrow_resident_hits, "see skippy-correctness");
  prod->add_flag("--cache-decoded-result-hits", o.cache_decoded_result_hits, "see skippy-correctness");
  prod->add_flag("--hits-from-disk", o.hits_from_disk,
                 "Skippy's hits read back from a disk tier (skippy-correctness --hits-from-disk), so the certification "
                 "covers the disk path");
  prod->add_option("--correctness-timeout-secs", o.correctness_timeout_secs, "per certification")->capture_default_str();
  prod->add_option("--server-startup-timeout-secs", o.server_startup_timeout_secs, "llama-server health wait")->capture_default_str();
  prod->add_option("--request-timeout-secs", o.request_timeout_secs, "per HTTP request")->capture_default_str();
  prod->add_option("--model-dir", o.model_dir, "real GGUFs named <family-key>.gguf instead of the zoo");
  prod->add_option("--zoo-preset", o.zoo_preset, "tiny | bench | real")->capture_default_str();
  prod->add_option("--zoo-dir", o.zoo_dir, "zoo directory (default: the cache's zoo/<preset>)");
  prod->add_option("--zoo-format", o.zoo_format,
                   "weight format of the zoo models (written by skippy-zoo --format; ref: each family's model-ref format)")
      ->capture_default_str()->transform(ZooFormatOption);
  prod->add_option("--threads", o.threads, "threads for both servers")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  prod->add_option("--ctx-size", o.ctx_size, "context size for both")->capture_default_str();
  prod->add_option("--batch-size", o.batch_size, "batch = ubatch for both")->capture_default_str();
  std::string prod_fa = "on";
  prod->add_option("--flash-attn", prod_fa, "on | off for both (never auto)")->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  prod->add_option("--concurrency-sweep", concurrency, "comma-separated client counts, e.g. 1,2,4");
  prod->add_option("--concurrent-requests", o.concurrent_requests, "requests per sweep level")->capture_default_str();
  prod->add_option("--ttft-slo-ms", o.ttft_slo_ms, "TTFT SLO for goodput")->capture_default_str();
  prod->add_option("--tpot-slo-ms", o.tpot_slo_ms, "TPOT SLO for goodput")->capture_default_str();

  skippy::bench::ReportOptions ro;
  bool no_charts = false;
  CLI::App* rep = app.add_subcommand("report", "render README tables (and charts) from production JSON");
  rep->add_option("--input", ro.inputs, "production-cache-bench.json (repeatable)")->required();
  rep->add_option("--output", ro.output, "markdown file")->required();
  rep->add_flag("--no-charts", no_charts, "skip the gnuplot charts");

  skippy::bench::ServeCompareOptions sc;
  sc.skippy_server_bin = (SelfDir() / "skippy-server").string();
  sc.llama_server_bin = o.llama_server_bin;
  std::string sc_preset = "bench";
  std::string sc_fa = "on";  // skippy-server's own default with the batch-invariant kernels
  CLI::App* cmp = app.add_subcommand("serve-compare", "skippy-server vs llama-server over HTTP on serving workloads");
  cmp->add_option("--output-dir", sc.output_dir, "where serve-compare.json/.md go")->required();
  cmp->add_option("--case", sc.cases, "family key (repeatable)")->capture_default_str();
  cmp->add_option("--workload", sc.workloads, "workload name (repeatable); default: all of them");
  cmp->add_option("--server", sc.servers, "skippy | llama-default | llama-matched (repeatable)")->capture_default_str();
  cmp->add_option("--lanes", sc.lanes, "skippy lanes = llama-server slots")->capture_default_str();
  cmp->add_option("--threads", sc.threads, "threads for both")->capture_default_str()->check(CLI::Range(1, 1024));
  cmp->add_option("--ctx-size", sc.ctx_size, "context per request")->capture_default_str();
  cmp->add_option("--batch-size", sc.batch_size, "batch size for both")->capture_default_str();
  cmp->add_option("--flash-attn", sc_fa,
                  "on | off for skippy-server and llama-matched (llama-default: auto, on for the CPU backend)")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  cmp->add_option("--repeats", sc.repeats, "interleaved repeats of each run")->capture_default_str();
  cmp->add_option("--ttft-slo-ms", sc.ttft_slo_ms, "TTFT SLO for goodput")->capture_default_str();
  cmp->add_option("--tpot-slo-ms", sc.tpot_slo_ms, "time-per-output-token SLO for goodput (0: TTFT only)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmp->add_option("--think-ms", sc.think_ms,
                  "pause before each request that sends the server's reply back (chat-replies), as a user or a tool "
                  "takes; not counted in wall time")
      ->capture_default_str()->check(CLI::Range(0, 600000));
  cmp->add_option("--seed", sc.workload.seed, "workload seed")->capture_default_str();
  cmp->add_option("--long-prefix-words", sc.workload.long_prefix_words, "words in long prefixes")->capture_default_str();
  cmp->add_option("--requests", sc.workload.requests, "requests of repeat/shared-prefix")->capture_default_str();
  cmp->add_option("--documents", sc.workload.documents, "interleaved-prefixes K; long-answers' cold documents")->capture_default_str();
  cmp->add_option("--rounds", sc.workload.rounds, "interleaved-prefixes rounds")->capture_default_str();
  cmp->add_option("--conversations", sc.workload.conversations, "multi-turn and chat-replies conversations")->capture_default_str();
  cmp->add_option("--turns", sc.workload.turns, "multi-turn and chat-replies turns")->capture_default_str();
  cmp->add_option("--agent-steps", sc.workload.agent_steps, "agent-loop steps")->capture_default_str();
  cmp->add_option("--n-predict", sc.workload.n_predict, "generated tokens per request")->capture_default_str();
  cmp->add_option("--answer-tokens", sc.workload.answer_tokens, "generated tokens of long-answers' long answers")
      ->capture_default_str();
  cmp->add_option("--skippy-server-bin", sc.skippy_server_bin, "skippy-server binary")->capture_default_str();
  cmp->add_option("--skippy-arg", sc.skippy_args, "extra skippy-server flag (repeatable), e.g. --skippy-arg=--cache-tokens=2048")
      ->allow_extra_args(false);
  cmp->add_option("--llama-server-bin", sc.llama_server_bin, "llama-server binary")->capture_default_str();
  cmp->add_option("--model-dir", sc.model_dir, "real GGUFs named <family-key>.gguf");
  cmp->add_option("--zoo-preset", sc_preset, "zoo preset")->capture_default_str();
  cmp->add_option("--zoo-dir", sc.zoo_dir, "zoo directory (default: the cache's zoo/<preset>)");
  cmp->add_option("--zoo-format", sc.zoo_format,
                  "weight format of the zoo models (written by skippy-zoo --format; ref: each family's model-ref format)")
      ->capture_default_str()->transform(ZooFormatOption);
  bool sc_render_only = false;
  cmp->add_flag("--render-only", sc_render_only, "rewrite serve-compare.md from the JSON in --output-dir; run nothing");
  std::string sc_sweep;
  cmp->add_option("--concurrency-sweep", sc_sweep, "comma-separated client counts, e.g. 1,2,4,8");
  cmp->add_option("--sweep-workload", sc.sweep_workload, "the workload the clients of the sweep send")
      ->capture_default_str()
      ->check(CLI::IsMember(skippy::bench::WorkloadNames()));

  skippy::bench::FleetOptions fl;
  fl.skippy_server_bin = sc.skippy_server_bin;
  fl.skippy_router_bin = (SelfDir() / "skippy-router").string();
  fl.llama_server_bin = o.llama_server_bin;
  fl.workload.documents = 11;  // not a multiple of the replicas: round robin must not pin documents by accident
  fl.workload.long_prefix_words = 600;
  std::string fl_preset = "bench", fl_fa = "off";
  bool fl_no_faults = false;
  CLI::App* fleet = app.add_subcommand(
      "fleet", "skippy-server replicas on a shared Redis tier behind skippy-router vs llama-servers behind round robin");
  fleet->add_option("--output-dir", fl.output_dir, "where fleet.json/.md go")->required();
  fleet->add_option("--case", fl.case_key, "family key")->capture_default_str();
  fleet->add_option("--workload", fl.workloads, "workload name (repeatable)")->capture_default_str();
  fleet->add_option("--replicas", fl.replicas, "replicas on each side")->capture_default_str();
  fleet->add_option("--threads", fl.threads, "threads per replica")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  fleet->add_option("--ctx-size", fl.ctx_size, "context per request")->capture_default_str();
  fleet->add_option("--flash-attn", fl_fa, "on | off for both")->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  fleet->add_option("--replica-cache-mib", fl.replica_cache_mib,
                    "each skippy replica's RAM for prefixes (0: its default); below what every document needs")
      ->capture_default_str();
  fleet->add_option("--repeats", fl.repeats, "runs per side (the median run by TTFT p50 is reported)")->capture_default_str();
  fleet->add_flag("--no-faults", fl_no_faults, "skip the fault run");
  fleet->add_option("--seed", fl.workload.seed, "workload seed")->capture_default_str();
  fleet->add_option("--long-prefix-words", fl.workload.long_prefix_words, "words in long prefixes")->capture_default_str();
  fleet->add_option("--documents", fl.workload.documents, "interleaved-prefixes documents")->capture_default_str();
  fleet->add_option("--rounds", fl.workload.rounds, "interleaved-prefixes rounds")->capture_default_str();
  fleet->add_option("--conversations", fl.workload.conversations, "multi-turn conversations")->capture_default_str();
  fleet->add_option("--turns", fl.workload.turns, "multi-turn turns")->capture_default_str();
  fleet->add_option("--agent-steps", fl.workload.agent_steps, "agent-loop steps")->capture_default_str();
  fleet->add_option("--n-predict", fl.workload.n_predict, "generated tokens per request")->capture_default_str();
  fleet->add_option("--skippy-server-bin", fl.skippy_server_bin, "skippy-server binary")->capture_default_str();
  fleet->add_option("--skippy-router-bin", fl.skippy_router_bin, "skippy-router binary")->capture_default_str();
  fleet->add_option("--llama-server-bin", fl.llama_server_bin, "llama-server binary")->capture_default_str();
  fleet->add_option("--redis-server-bin", fl.redis_server_bin, "redis-server binary")->capture_default_str();
  fleet->add_option("--model-dir", fl.model_dir, "real GGUFs named <family-key>.gguf");
  fleet->add_option("--zoo-preset", fl_preset, "zoo preset")->capture_default_str();
  fleet->add_option("--zoo-dir", fl.zoo_dir, "zoo directory (default: the cache's zoo/<preset>)");
  fleet->add_option("--zoo-format", fl.zoo_format, "weight format of the zoo models")
      ->capture_default_str()->transform(ZooFormatOption);

  try {
    app.parse(argc, argv);
    o.prefix_tokens = ParseIntList(sweep.empty() ? prefix_tokens : sweep);
    if (!concurrency.empty()) o.concurrency_sweep = ParseIntList(concurrency);
    for (int32_t c : ParseIntList(sc_sweep)) sc.concurrency_sweep.push_back(c);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skippy-bench: bad number list: %s\n", e.what());
    return 2;
  }

  if (*prod) {
    o.flash_attn = prod_fa == "on";
    if (o.zoo_dir.empty()) o.zoo_dir = DefaultCacheDir() + "/zoo/" + o.zoo_preset;
    if (!o.concurrency_sweep.empty()) {
      if (absl::Status s = skippy::bench::CheckConcurrencySweep(o); !s.ok()) return Fail(s);
    }
    auto doc = skippy::bench::RunProduction(o);
    if (!doc.ok()) return Fail(doc.status());
    size_t ok = 0, rows = (*doc)["rows"].size();
    for (const auto& r : (*doc)["rows"]) ok += r.value("status", "") == "ok";
    std::fprintf(stderr, "[bench] done: %zu/%zu rows measured against llama-server -> %s/production-cache-bench.json\n", ok,
                 rows, o.output_dir.c_str());
    if (!o.concurrency_sweep.empty()) {
      auto sweep_doc = skippy::bench::RunConcurrencySweep(o);
      if (!sweep_doc.ok()) return Fail(sweep_doc.status());
      std::fprintf(stderr, "[bench] concurrency sweep -> %s/concurrency-sweep.json\n", o.output_dir.c_str());
    }
    return 0;
  }
  if (*fleet) {
    fl.flash_attn = fl_fa == "on";
    fl.faults = !fl_no_faults;
    if (fl.zoo_dir.empty()) fl.zoo_dir = DefaultCacheDir() + "/zoo/" + fl_preset;
    auto doc = skippy::bench::RunFleet(fl);
    if (!doc.ok()) return Fail(doc.status());
    std::fprintf(stderr, "[fleet] -> %s/fleet.json\n", fl.output_dir.c_str());
    return 0;
  }
  if (*cmp && sc_render_only) {
    if (absl::Status st = skippy::bench::RenderServeCompare(sc.output_dir); !st.ok()) return Fail(st);
    std::fprintf(stderr, "[serve-compare] -> %s/serve-compare.md\n", sc.output_dir.c_str());
    return 0;
  }
  if (*cmp) {
    sc.flash_attn = sc_fa == "on";
    if (sc.zoo_dir.empty()) sc.zoo_dir = DefaultCacheDir() + "/zoo/" + sc_preset;
    auto doc = skippy::bench::RunServeCompare(sc);
    if (!doc.ok()) return Fail(doc.status());
    std::fprintf(stderr, "[serve-compare] -> %s/serve-compare.json\n", sc.output_dir.c_str());
    return 0;
  }
  ro.charts = !no_charts;
  auto md = skippy::bench::WriteReport(ro);
  if (!md.ok()) return Fail(md.status());
  std::fprintf(stderr, "[bench] report -> %s\n", ro.output.c_str());
  return 0;
}
