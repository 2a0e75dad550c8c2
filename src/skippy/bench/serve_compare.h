// skippy-bench serve-compare: skippy-server and llama-server on the same model with matched
// resources (threads, per-request context, lanes = slots, batch, flash attention), driven by the
// same C++ client through HTTP on the same deterministic workloads, runs interleaved A/B/C.
//
// Servers: "skippy" (skippy-server), "llama-default" (llama-server with its host-RAM prompt cache
// on, as shipped), "llama-matched" (llama-server with --cache-ram 0: only its slots' own prompt
// caches, the single-slot comparison). Each (workload, repeat, server) run starts a fresh server.
// Per request: TTFT (first streamed token) and end-to-end latency at the client, reused and
// recomputed prompt tokens from the server's timings, the generated text. Per run: p50/p95,
// throughput, goodput at the TTFT SLO, peak resident memory. Output: serve-compare.json and .md.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/bench/workloads.h"
#include "skippy/common/status.h"

namespace skippy::bench {

struct ServeCompareOptions {
  std::string output_dir;
  std::vector<std::string> cases = {"llama"};
  std::vector<std::string> workloads;  // empty = all
  std::vector<std::string> servers = {"skippy", "llama-default", "llama-matched"};
  WorkloadOptions workload;
  int lanes = 1;
  int threads = 2;
  int ctx_size = 4096;
  int batch_size = 512;
  // skippy-server and llama-matched; llama-default keeps llama-server's own default (auto, which
  // is on for the CPU backend). Off by default: skippy-server's default, where a hit may prefill
  // any suffix of 2+ tokens (runtime::MinExactBatch).
  bool flash_attn = false;
  int repeats = 2;
  double ttft_slo_ms = 1000;
  std::string skippy_server_bin;
  std::vector<std::string> skippy_args;  // extra skippy-server flags (recorded in the JSON)
  std::string llama_server_bin;
  std::string model_dir;
  std::string zoo_dir;
  // Concurrency sweep: for each level c, every server runs with c lanes/slots and c clients send
  // the interleaved-prefixes workload concurrently. Empty = no sweep.
  std::vector<int> concurrency_sweep;
  int server_startup_timeout_secs = 120;
  int request_timeout_secs = 300;
};

StatusOr<nlohmann::json> RunServeCompare(const ServeCompareOptions& options);
// Rewrites <output_dir>/serve-compare.md from <output_dir>/serve-compare.json (no servers run).
// NotFound without the JSON, InvalidArgument if it is not a serve-compare result.
[[nodiscard]] Status RenderServeCompare(const std::string& output_dir);

}  // namespace skippy::bench
