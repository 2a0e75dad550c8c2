// skippy-correctness: certifiers that prove a cache path exact against recomputation.
//
//   skippy-correctness state-handoff --model FILE --prompt TEXT [--state-payload-kind KIND]
//       [--prefix-token-count 128] [--cache-hit-repeats 5] [--runtime-lane-count 2]
//       [--report-out FILE] ...
//   skippy-correctness batch-split --model FILE [--flash-attn on|off] [--min-batch N] [--report-out FILE]
//       prefills the same tokens under several batch cuts (every batch >= N rows, default
//       runtime::MinExactBatch) and compares the logits byte for byte (certify/batch_split.h).
//   skippy-correctness step-with-chunk --model FILE [--flash-attn on|off] [--time-rounds N] [--report-out FILE]
//       the checks that one graph through the ragged split gives every row its bits alone: a prompt
//       chunk and decode steps of other lanes, or two lanes' chunks, in one llama_decode
//       (certify::CheckStepWithChunk), and a step of lanes apart, 0 and 2 (certify::CheckLaneBatching);
//       they need the one-row class (it is switched on). With --time-rounds N > 0, what that one graph
//       costs against a chunk and a step as two llama_decode calls (chunks of 32, 128 and 384 rows
//       beside 1 and 3 lanes), and two lanes' chunks of 8-128 rows each against one call each (N
//       alternating rounds, medians), and a step of lanes apart against one per run of consecutive
//       lanes (2N rounds, medians; "ragged_steps_timing").
//   skippy-correctness --no-batch-invariant ...  runs either on llama.cpp's stock matrix kernels
//       (runtime/llama_backend.h), to show what the batch-invariant patch changes.
//   skippy-correctness --one-row-class ...  with the patch series' one-row class on as well (a lone
//       row takes the batch kernels, the smallest exact batch is 1), as skippy-server --lane-batching.
//
// Exit codes: 0 pass, 1 mismatch (exit 0 with --allow-mismatch), 2 bad input, 3 family disabled or
// payload refused by policy (not certified), 4 internal error.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"
#include "skippy/certify/batch_split.h"
#include "skippy/certify/lane_batching.h"
#include "skippy/certify/state_handoff.h"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"

namespace {

constexpr int kExitPass = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitDisabled = 3;
constexpr int kExitInternal = 4;

int ExitCodeFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
      return kExitBadInput;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
      return kExitDisabled;
    default:
      return kExitInternal;
  }
}

// A report's text: a prompt cut at a token boundary or a model's name can hold bytes that are not
// UTF-8, which are written as U+FFFD rather than thrown.
std::string ReportText(const nlohmann::json& report) {
  return report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool WriteReport(const nlohmann::json& report, const std::string& path) {
  const std::string text = ReportText(report);
  if (path.empty()) {
    std::cout << text << "\n";
    return true;
  }
  std::ofstream out(path);
  out << text << "\n";
  if (!out) std::fprintf(stderr, "skippy-correctness: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

struct BatchSplitArgs {
  std::string model_path;
  std::string flash_attn = "on";
  int threads = 2;
  uint32_t batch_size = 512;
  size_t min_batch = 0;  // 0: runtime::MinExactBatch
  int n_gpu_layers = 0;
  std::string report_out;
};

// skippy-server's layout: one KV stream per lane, full-size sliding-window layers, 1024 cells a lane.
skippy::runtime::EngineOptions ServerLayout(const std::string& model, const std::string& flash_attn, int threads,
                                            uint32_t batch_size, uint32_t lanes) {
  skippy::runtime::EngineOptions eo;
  eo.model_path = model;
  eo.context.n_ctx = 1024 * lanes;
  eo.context.n_batch = eo.context.n_ubatch = batch_size;
  eo.context.n_threads = threads;
  eo.context.flash_attn = flash_attn == "on";
  eo.context.kv_unified = false;
  eo.context.swa_full = true;
  eo.lane_count = lanes;
  eo.cache_seq_count = 0;
  return eo;
}

int RunBatchSplit(const BatchSplitArgs& a) {
  skippy::runtime::EngineOptions eo = ServerLayout(a.model_path, a.flash_attn, a.threads, a.batch_size, 1);
  eo.n_gpu_layers = a.n_gpu_layers;
  auto engine = skippy::runtime::Engine::Open(eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "skippy-correctness: %s\n", engine.status().ToString().c_str());
    return ExitCodeFor(engine.status());
  }
  const size_t m = a.min_batch > 0 ? a.min_batch : (*engine)->MinExactBatch();
  auto r = skippy::certify::CheckBatchSplits(**engine, 0, m);
  if (!r.ok()) {
    std::fprintf(stderr, "skippy-correctness: %s\n", r.status().ToString().c_str());
    return ExitCodeFor(r.status());
  }
  nlohmann::json report = r->ToJson();
  report["mode"] = "batch-split";
  report["model"] = a.model_path;
  report["family_key"] = (*engine)->family().family_key;
  report["flash_attn"] = a.flash_attn == "on";
  report["threads"] = a.threads;
  report["batch_size"] = a.batch_size;
  report["n_gpu_layers"] = a.n_gpu_layers;
  report["rule_min_batch"] = (*engine)->MinExactBatch();
  report["batch_invariant"] = skippy::runtime::BatchInvariant();
  report["one_row_class"] = skippy::runtime::OneRowClass();
  if (!WriteReport(report, a.report_out)) return kExitInternal;
  std::fprintf(stderr, "[batch-split] %s flash_attn=%s min_batch=%zu batch_invariant=%s %s\n",
               report["family_key"].get<std::string>().c_str(), a.flash_attn.c_str(), m,
               skippy::runtime::BatchInvariant() ? "on" : "off", r->pass ? "pass" : "MISMATCH");
  return r->pass ? kExitPass : kExitMismatch;
}

using StatusOrJson = skippy::StatusOr<nlohmann::json>;

struct StepWithChunkArgs {
  std::string model_path;
  std::string flash_attn = "on";
  int threads = 2;
  uint32_t batch_size = 512;
  int time_rounds = 5;
  std::string report_out;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One graph against two: a chunk into lane 0 (400 tokens in it) beside a step of lanes 1..k (400
// each), as DecodeStepWithChunks, against Prefill of the chunk then DecodeStep of the lanes; then
// chunks into lanes 0 and 1 in one graph against a Prefill each; alternating which comes first,
// every lane cut back after each.
StatusOrJson TimeStepWithChunk(skippy::runtime::Engine& e, int rounds) {
  using skippy::runtime::Engine;
  using Clock = std::chrono::steady_clock;
  auto tokens = skippy::certify::BenchmarkTokens(e.model(), "Step with a chunk: what one graph saves.", 800);
  if (!tokens.ok()) return tokens.status();
  const int32_t held = 400;
  for (int32_t l = 0; l < 4; ++l) {
    if (auto st = e.Prefill(l, std::span(*tokens).first(held), 0); !st.ok()) return st;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (size_t chunk_rows : {32, 128, 384}) {
    for (int32_t k : {1, 3}) {
      const std::span<const skippy::runtime::Token> chunk = std::span(*tokens).subspan(held, chunk_rows);
      std::vector<Engine::DecodeStepIn> steps;
      for (int32_t l = 1; l <= k; ++l) steps.push_back({l, (*tokens)[1], held});
      std::vector<double> two, one;
      for (int r = 0; r < 2 * rounds; ++r) {
        const auto t0 = Clock::now();
        const bool as_one = (r % 2 == 1) == ((r / 2) % 2 == 0);
        if (as_one) {
          const Engine::ChunkIn in{0, chunk, held, false};
          auto out = e.DecodeStepWithChunks(steps, std::span(&in, 1));
          if (!out.ok()) return out.status();
        } else {
          if (auto st = e.Prefill(0, chunk, held); !st.ok()) return st;
          auto out = e.DecodeStep(steps);
          if (!out.ok()) return out.status();
        }
        (as_one ? one : two).push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        for (int32_t l = 0; l <= k; ++l) {
          if (auto st = e.Truncate(l, held); !st.ok()) return st;
        }
      }
      const double a = Median(two), b = Median(one);
      rows.push_back({{"chunk_rows", chunk_rows}, {"lanes_stepping", k}, {"two_calls_ms", a}, {"one_graph_ms", b},
                      {"saved", a > 0 ? 1.0 - b / a : 0.0}, {"rounds", rounds}});
    }
  }
  // Two lanes' chunks of equal size in one graph against one Prefill each.
  for (size_t chunk_rows : {8, 16, 32, 64, 128}) {
    const std::span<const skippy::runtime::Token> chunk = std::span(*tokens).subspan(held, chunk_rows);
    const Engine::ChunkIn both[] = {{0, chunk, held, false}, {1, chunk, held, false}};
    std::vector<double> two, one;
    for (int r = 0; r < 2 * rounds; ++r) {
      const auto t0 = Clock::now();
      const bool as_one = (r % 2 == 1) == ((r / 2) % 2 == 0);
      if (as_one) {
        auto out = e.DecodeStepWithChunks({}, both);
        if (!out.ok()) return out.status();
      } else {
        for (const Engine::ChunkIn& c : both) {
          if (auto st = e.Prefill(c.lane, c.tokens, c.pos); !st.ok()) return st;
        }
      }
      (as_one ? one : two).push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      for (int32_t l = 0; l <= 1; ++l) {
        if (auto st = e.Truncate(l, held); !st.ok()) return st;
      }
    }
    const double a = Median(two), b = Median(one);
    rows.push_back({{"chunk_rows", chunk_rows}, {"chunks", 2}, {"lanes_stepping", 0}, {"two_calls_ms", a},
                    {"one_graph_ms", b}, {"saved", a > 0 ? 1.0 - b / a : 0.0}, {"rounds", rounds}});
  }
  return rows;
}

// Steps of lanes apart in one graph (a ragged step) against one DecodeStep per run of consecutive
// lanes, beside a step of as many consecutive lanes; every lane starts with 400 tokens and each
// step appends (a hybrid's state cannot be cut back; a few dozen tokens more change little), the
// lanes filled again (untimed) before a round that would outgrow a lane, the shapes in a rotated
// order each round; medians of `rounds`.
StatusOrJson TimeRaggedSteps(skippy::runtime::Engine& e, int rounds) {
  using skippy::runtime::Engine;
  using Clock = std::chrono::steady_clock;
  auto tokens = skippy::certify::BenchmarkTokens(e.model(), "Lanes apart: what one graph saves.", 400);
  if (!tokens.ok()) return tokens.status();
  auto fill = [&]() -> skippy::Status {
    for (int32_t l = 0; l < 4; ++l) {
      if (auto st = e.Clear(l); !st.ok()) return st;
      if (auto st = e.Prefill(l, *tokens, 0); !st.ok()) return st;
    }
    return absl::OkStatus();
  };
  if (auto st = fill(); !st.ok()) return st;
  struct Shape {
    const char* name;
    std::vector<std::vector<int32_t>> calls;  // one DecodeStep each
  };
  const std::vector<Shape> shapes = {
      {"1 lane", {{0}}},
      {"2 consecutive lanes", {{0, 1}}},
      {"2 lanes apart, per run", {{0}, {2}}},
      {"2 lanes apart, one graph", {{0, 2}}},
      {"3 consecutive lanes", {{0, 1, 2}}},
      {"3 lanes apart, per run", {{0, 1}, {3}}},
      {"3 lanes apart, one graph", {{0, 1, 3}}},
  };
  std::vector<std::vector<double>> ms(shapes.size());
  for (int r = 0; r < rounds; ++r) {
    // Lane 0 steps once in every shape: a round appends shapes.size() tokens to it.
    if (e.SequenceLength(0) + static_cast<int32_t>(shapes.size()) > e.LaneCapacity()) {
      if (auto st = fill(); !st.ok()) return st;
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& shape = shapes[(i + static_cast<size_t>(r)) % shapes.size()];
      const auto t0 = Clock::now();
      for (const std::vector<int32_t>& lanes : shape.calls) {
        std::vector<Engine::DecodeStepIn> steps;
        for (int32_t l : lanes) steps.push_back({l, (*tokens)[1], e.SequenceLength(l)});
        auto out = e.DecodeStep(steps);
        if (!out.ok()) return out.status();
      }
      ms[(i + static_cast<size_t>(r)) % shapes.size()].push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < shapes.size(); ++i) {
    rows.push_back({{"shape", shapes[i].name}, {"calls", shapes[i].calls.size()}, {"ms", Median(ms[i])}, {"rounds", rounds}});
  }
  return rows;
}

// Prints `status` and returns its exit code.
int Fail(const skippy::Status& status) {
  std::fprintf(stderr, "skippy-correctness: %s\n", status.ToString().c_str());
  return ExitCodeFor(status);
}

int RunStepWithChunk(const StepWithChunkArgs& a) {
  if (!skippy::runtime::OneRowClass()) {
    std::fprintf(stderr, "skippy-correctness: step-with-chunk needs the one-row class (this build or --no-batch-invariant)\n");
    return kExitBadInput;
  }
  auto engine = skippy::runtime::Engine::Open(ServerLayout(a.model_path, a.flash_attn, a.threads, a.batch_size, 4));
  if (!engine.ok()) return Fail(engine.status());
  skippy::runtime::Engine& e = **engine;
  if (!e.CanStepLanesApart()) {
    return Fail(absl::FailedPreconditionError(
        "this model cannot take a ragged step (a recurrent model, a learned architecture, or no ragged split)"));
  }
  // A chunk beside steps needs attention-only memory; a step of lanes apart (equal runs) also
  // holds for hybrids.
  nlohmann::json report;
  bool pass = true;
  if (e.CanStepWithChunk()) {
    auto r = skippy::certify::CheckStepWithChunk(e, 0, 1, 2);
    if (!r.ok()) return Fail(r.status());
    report = r->ToJson();
    pass = r->pass;
  } else {
    report["chunk_check"] = "not run: a hybrid's decode rows do not step beside a chunk";
  }
  auto apart = skippy::certify::CheckLaneBatching(e, 0, 2);  // a ragged step of lanes 0 and 2
  if (!apart.ok()) return Fail(apart.status());
  pass = pass && apart->pass;
  report["lanes_apart"] = apart->ToJson();
  report["pass"] = pass;
  report["mode"] = "step-with-chunk";
  report["model"] = a.model_path;
  report["family_key"] = e.family().family_key;
  report["flash_attn"] = a.flash_attn == "on";
  report["threads"] = a.threads;
  report["batch_size"] = a.batch_size;
  if (a.time_rounds > 0) {
    if (e.CanStepWithChunk()) {
      auto t = TimeStepWithChunk(e, a.time_rounds);
      if (!t.ok()) return Fail(t.status());
      report["timing"] = *t;
    }
    auto apart_t = TimeRaggedSteps(e, 2 * a.time_rounds);
    if (!apart_t.ok()) return Fail(apart_t.status());
    report["ragged_steps_timing"] = *apart_t;
  }
  if (!WriteReport(report, a.report_out)) return kExitInternal;
  std::fprintf(stderr, "[step-with-chunk] %s flash_attn=%s %s\n", report["family_key"].get<std::string>().c_str(),
               a.flash_attn.c_str(), pass ? "pass" : "MISMATCH");
  return pass ? kExitPass : kExitMismatch;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"skippy-correctness: prove cache restores bit-identical to recomputation"};
  app.require_subcommand(1);
  bool stock_kernels = false;
  app.add_flag("--no-batch-invariant", stock_kernels,
               "llama.cpp's stock matrix kernels, even where the patched build has batch-invariant ones");
  bool one_row_class = false;
  app.add_flag("--one-row-class", one_row_class,
               "the batch-invariant kernels' one-row class too (a lone row takes the batch kernels; the runtime's "
               "smallest exact batch becomes 1), as skippy-server --lane-batching runs");
  CLI::App* sh = app.add_subcommand("state-handoff", "prefill, record, restore, compare continuations");

  skippy::certify::StateHandoffOptions o;
  std::string payload_name;
  std::string report_out;
  std::string prompt_file;
  bool allow_mismatch = false;
  std::string flash_attn = "on";
  sh->add_option("--model", o.model_path, "GGUF model file")->required();
  sh->add_option("--model-id", o.model_id, "model identity (default: sha256 of the file)");
  sh->add_option("--ctx-size", o.ctx_size, "context size")->capture_default_str();
  sh->add_option("--n-gpu-layers", o.n_gpu_layers, "layers to offload")->capture_default_str();
  sh->add_option("--threads", o.threads, "CPU threads")->capture_default_str()->check(CLI::Range(1, 1024));
  sh->add_option("--batch-size", o.batch_size, "n_batch = n_ubatch")->capture_default_str();
  sh->add_option("--flash-attn", flash_attn, "on | off, never auto")->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  sh->add_option("--cache-type-k", o.type_k, "K cache type")->capture_default_str();
  sh->add_option("--cache-type-v", o.type_v, "V cache type")->capture_default_str();
  auto* prompt_opt = sh->add_option("--prompt", o.prompt, "prompt text");
  sh->add_option("--prompt-file", prompt_file, "read the prompt from a file")->excludes(prompt_opt);
  sh->add_option("--state-payload-kind", payload_name,
                 "resident-kv | kv-recurrent | full-state | recurrent-only (default: the family's)");
  sh->add_option("--prefix-token-count", o.prefix_token_count, "prefix tokens")->capture_default_str();
  sh->add_option("--suffix-token-count", o.suffix_token_count, "suffix-check tokens")->capture_default_str();
  sh->add_option("--cache-hit-repeats", o.cache_hit_repeats, "cache hits after the first restore")->capture_default_str();
  sh->add_option("--runtime-lane-count", o.lane_count, "lanes in the context")->capture_default_str();
  sh->add_option("--report-out", report_out, "write the JSON report here (default: stdout)");
  sh->add_flag("--borrow-resident-hits", o.borrow_resident_hits, "hits keep the shared prefix and roll back");
  sh->add_flag("--cache-decoded-result-hits", o.cache_decoded_result_hits, "hits answer from stored logits");
  sh->add_flag("--skip-suffix-prefill-check", o.skip_suffix_prefill_check, "skip the suffix check");
  sh->add_option("--hits-from-disk", o.hits_from_disk_dir,
                 "restore from the disk tier in this directory: the payload is written, the tier reopened, and every "
                 "hit reads the file back (the directory's entries are replaced)");
  sh->add_flag("--allow-mismatch", allow_mismatch, "exit 0 on a mismatch (the report still says so)");
  BatchSplitArgs bs;
  CLI::App* bsc = app.add_subcommand("batch-split", "are logits independent of where prefill batches are cut?");
  bsc->add_option("--model", bs.model_path, "GGUF model file")->required();
  bsc->add_option("--flash-attn", bs.flash_attn, "on | off, never auto")->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  bsc->add_option("--threads", bs.threads, "CPU threads")->capture_default_str()->check(CLI::Range(1, 1024));
  bsc->add_option("--batch-size", bs.batch_size, "n_batch = n_ubatch")->capture_default_str();
  bsc->add_option("--min-batch", bs.min_batch, "smallest batch a cut uses (default: the runtime's rule, 64 on / 2 off)");
  bsc->add_option("--n-gpu-layers", bs.n_gpu_layers, "layers to offload (a GPU build of llama.cpp)")->capture_default_str();
  bsc->add_option("--report-out", bs.report_out, "write the JSON report here (default: stdout)");
  StepWithChunkArgs sw;
  CLI::App* swc = app.add_subcommand(
      "step-with-chunk",
      "are a chunk's and other lanes' steps, and steps of lanes apart, the same bits in one llama_decode? (and their cost)");
  swc->add_option("--model", sw.model_path, "GGUF model file")->required();
  swc->add_option("--flash-attn", sw.flash_attn, "on | off, never auto")->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  swc->add_option("--threads", sw.threads, "CPU threads")->capture_default_str()->check(CLI::Range(1, 1024));
  swc->add_option("--batch-size", sw.batch_size, "n_batch = n_ubatch")->capture_default_str();
  swc->add_option("--time-rounds", sw.time_rounds, "timing rounds per shape (0: the check only)")
      ->capture_default_str()->check(CLI::Range(0, 1000));
  swc->add_option("--report-out", sw.report_out, "write the JSON report here (default: stdout)");
  int32_t layer_end = -1, state_layer_start = -1, state_layer_end = -1, state_stage_index = -1;
  sh->add_option("--layer-end", layer_end, "stage layer end (whole model only)");
  sh->add_option("--state-layer-start", state_layer_start, "state layer start (whole model only)");
  sh->add_option("--state-layer-end", state_layer_end, "state layer end (whole model only)");
  sh->add_option("--state-stage-index", state_stage_index, "stage index (0 only)");
  sh->add_option("--stage-load-mode", o.stage_load_mode, "full (only)")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitPass : kExitBadInput;
  }
  if (stock_kernels) skippy::runtime::SetBatchInvariant(false);
  if (one_row_class && !stock_kernels && !skippy::runtime::SetOneRowClass(true)) {
    std::fprintf(stderr, "skippy-correctness: --one-row-class: this llama.cpp build has no one-row class\n");
    return kExitBadInput;
  }
  if (*bsc) return RunBatchSplit(bs);
  if (*swc) {
    if (!stock_kernels) skippy::runtime::SetOneRowClass(true);
    return RunStepWithChunk(sw);
  }
  o.flash_attn = flash_attn == "on";
  if (layer_end >= 0) o.layer_end = layer_end;
  if (state_layer_start >= 0) o.state_layer_start = state_layer_start;
  if (state_layer_end >= 0) o.state_layer_end = state_layer_end;
  if (state_stage_index >= 0) o.state_stage_index = state_stage_index;
  if (!prompt_file.empty()) {
    std::ifstream in(prompt_file);
    if (!in) {
      std::fprintf(stderr, "skippy-correctness: cannot read %s\n", prompt_file.c_str());
      return kExitBadInput;
    }
    o.prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (!payload_name.empty()) {
    auto kind = skippy::cache::ParsePayloadKind(payload_name);
    if (!kind.ok()) {
      std::fprintf(stderr, "skippy-correctness: %s\n", std::string(kind.status().message()).c_str());
      return kExitBadInput;
    }
    o.payload = *kind;
  }

  auto result = skippy::certify::RunStateHandoff(o);
  if (!result.ok()) {
    std::fprintf(stderr, "skippy-correctness: %s\n", result.status().ToString().c_str());
    nlohmann::json err = {{"mode", "state-handoff"}, {"status", "error"}, {"matches", false},
                          {"error", std::string(result.status().message())},
                          {"error_code", absl::StatusCodeToString(result.status().code())}};
    if (!report_out.empty()) std::ofstream(report_out) << ReportText(err) << "\n";
    return ExitCodeFor(result.status());
  }
  const std::string text = ReportText(result->report);
  if (report_out.empty()) {
    std::cout << text << "\n";
  } else {
    std::ofstream out(report_out);
    out << text << "\n";
    if (!out) {
      std::fprintf(stderr, "skippy-correctness: cannot write %s\n", report_out.c_str());
      return kExitInternal;
    }
  }
  const auto& r = result->report;
  std::fprintf(stderr, "[state-handoff] %s payload=%s status=%s hit=%.2f ms recompute=%.2f ms\n",
               r["model_identity"].value("family_key", std::string("?")).c_str(),
               r.value("state_payload_kind", std::string("?")).c_str(), r.value("status", std::string("?")).c_str(),
               r.value("cache_hit_total_ms", 0.0), r.value("recompute_total_ms", 0.0));
  switch (result->verdict) {
    case skippy::certify::Verdict::kPass: return kExitPass;
    case skippy::certify::Verdict::kMismatch: return allow_mismatch ? kExitPass : kExitMismatch;
    case skippy::certify::Verdict::kDisabled: return kExitDisabled;
  }
  return kExitInternal;
}
