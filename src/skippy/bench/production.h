// skippy-bench production: certify each family with the state-handoff certifier, then measure
// llama-server (same llama.cpp build, matched settings) on the certifier's exact benchmark prompt,
// and write one row per (family, prefix length, use case) to OUT/production-cache-bench.json (and
// .md), rewritten after every row so an interrupted run keeps what it measured. Each row takes
// `rounds` turns of both sides (a certification with its timed hits, then llama-server's requests;
// llama-server first in every second round), and its numbers are the medians of the rounds'
// medians, so a drift of the machine's speed during a row falls on both sides.
//
// A family is measured against llama-server only if its certification passes; a failing, missing or
// timed-out case gets a status and a note and the run continues.
//
// Thread-safety: RunProduction runs one case at a time on the calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"

namespace skippy::bench {

struct ProductionOptions {
  std::string output_dir;
  std::vector<std::string> cases;          // family keys; empty = every family of the zoo
  uint32_t runtime_lane_count = 1;
  int llama_parallel = 1;
  std::vector<int32_t> prefix_tokens = {128};
  std::string use_case;                    // "" = the default prompt; a corpus key; or "all"
  std::string use_case_corpus;
  int cache_hit_repeats = 5;
  int llama_repeats = 6;                   // the first is cold; the median of the other five is the baseline
  int rounds = 1;                          // alternating turns of both sides per row (see above)
  bool skip_llama_server = false;
  std::string llama_server_bin;
  std::string correctness_bin;
  bool borrow_resident_hits = false;
  bool cache_decoded_result_hits = false;
  bool hits_from_disk = false;             // each certification's hits read from a disk tier (work dir)
  int correctness_timeout_secs = 300;
  int server_startup_timeout_secs = 60;
  int request_timeout_secs = 120;
  std::string model_dir;                   // real GGUFs named <family-key>.gguf replace zoo models
  std::string zoo_preset = "bench";
  std::string zoo_dir;                     // where the zoo preset lives
  std::string zoo_format = "F16";          // weight format of the zoo models (skippy-zoo --format; ref: each family's)
  int threads = 2;
  int ctx_size = 1024;
  int batch_size = 512;
  bool flash_attn = true;
  // Concurrency sweep against llama-server (empty = none).
  std::vector<int> concurrency_sweep;
  int concurrent_requests = 16;
  int sweep_n_predict = 16;
  double ttft_slo_ms = 2000;
  double tpot_slo_ms = 250;
};

// The prompt used for rows without a use case.
extern const char* const kDefaultBenchmarkPrompt;

// Runs the benchmark. Errors only for bad options (unknown case, unreadable corpus, unwritable
// output directory); per-case failures are rows with a status.
StatusOr<nlohmann::json> RunProduction(const ProductionOptions& options);

// Machine and build facts recorded with every run.
nlohmann::json MachineInfo();

}  // namespace skippy::bench
