// skippy-bench serve-compare: skippy-server and llama-server on the same model with matched
// resources (threads, per-request context, lanes = slots, batch, flash attention), driven by the
// same C++ client through HTTP on the same deterministic workloads, runs interleaved A/B/C.
//
// Servers: "skippy" (skippy-server), "llama-default" (llama-server with its host-RAM prompt cache
// on, as shipped), "llama-matched" (llama-server with --cache-ram 0: only its slots' own prompt
// caches, the single-slot comparison). Each (workload, repeat, server) run starts a fresh server.
// Per request: TTFT (first streamed token) and end-to-end latency at the client, reused and
// recomputed prompt tokens from the server's timings, the generated text, the longest wait between
// two tokens. Per run: p50/p95, throughput and goodput at the SLOs (SummarizeStreamRuns), peak
// resident memory; a run in which a request got no answer is failed, out of the medians, and listed
// under "Failed runs". Output: serve-compare.json and .md.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/bench/model_server.h"
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
  // is on for the CPU backend). On by default, as skippy-server is with the batch-invariant
  // kernels (a hit may then prefill any suffix of 2+ tokens, runtime::MinExactBatch).
  bool flash_attn = true;
  int repeats = 2;
  // A pause before each request that sends the server's own reply back (chat-replies), as a user
  // reading it or a tool running would take; not counted in wall time, so throughput compares the
  // servers' time only. 0: none (the next turn follows at once).
  int think_ms = 0;
  double ttft_slo_ms = 1000;
  // Goodput also asks each request's time per output token (after the first, as its client saw
  // it) to be within this (0: TTFT only).
  double tpot_slo_ms = 0;
  std::string skippy_server_bin;
  std::vector<std::string> skippy_args;  // extra skippy-server flags (recorded in the JSON)
  std::string llama_server_bin;
  std::string model_dir;
  std::string zoo_dir;
  std::string zoo_format = "F16";  // weight format of the zoo models (skippy-zoo --format; ref: each family's)
  // Concurrency sweep: for each level c, every server runs with c lanes/slots and c clients send
  // sweep_workload (interleaved-prefixes by default) concurrently. Empty = no sweep.
  std::vector<int> concurrency_sweep;
  std::string sweep_workload = "interleaved-prefixes";
  int server_startup_timeout_secs = 120;
  int request_timeout_secs = 300;
};

// When Skippy's greedy text for a request differs from llama-matched's, the workload is replayed on
// both (untimed, streamed with token ids and n_probs kProbeTopN) and each differing request gets
// DivergenceOf plus "same_tokens" (equal token ids: only the text rendering differs),
// "withheld_tail" (llama-matched's ids are a prefix of Skippy's and it then stopped sending: an
// error event, or as many tokens generated with the same stop; llama-server never streams a tail
// that is not valid UTF-8), "errors" and "reproduced" (the replay gave the timed run's texts) in
// the summary's "disagreements".
StatusOr<nlohmann::json> RunServeCompare(const ServeCompareOptions& options);

inline constexpr int kProbeTopN = 5;
// Two servers' greedy completions (llama-server's completion_probabilities, which both send) part at
// "position", the first generated token where their ids differ or one list ends (-1: never). For
// each side with a token there ("a", "b"): its token id and "gap", its log-probability minus that
// of the other side's token in its own top list (null when that token is not in the list; 0 or
// below is impossible for a greedy choice). "near_tie": both gaps known and below
// kNearTieNats -- the two servers' logits ranked two almost equal tokens apart, as last-bit
// differences (other batch splits) can.
inline constexpr double kNearTieNats = 0.1;
nlohmann::json DivergenceOf(const nlohmann::json& a, const nlohmann::json& b);
// One run's numbers from its requests, in the order sent, over wall_s seconds. A stream cut short by
// an error event counts in the latencies and tokens as its client saw them, and in "errors", not in
// throughput or goodput; a request that got no answer (StreamRun::ok false) has no latency and
// counts in "unanswered" only (a run with any is reported as failed and left out of the medians).
// A request is good (goodput, "slo_attainment" over every request) when it was served, its TTFT
// is within ttft_slo_ms and, with tpot_slo_ms > 0, its time per output token after the first too.
nlohmann::json SummarizeStreamRuns(const std::vector<StreamRun>& runs, double wall_s, double ttft_slo_ms,
                                   double tpot_slo_ms);

// Rewrites <output_dir>/serve-compare.md from <output_dir>/serve-compare.json (no servers run).
// NotFound without the JSON, InvalidArgument if it is not a serve-compare result.
[[nodiscard]] Status RenderServeCompare(const std::string& output_dir);

}  // namespace skippy::bench
