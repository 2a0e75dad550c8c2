// Everything skippy-server is configured with (the CLI fills it; tests construct it directly).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace skippy::server {

// --chunks-together: which prompt chunks of a turn share one graph (ServerOptions::chunks_together).
enum class ChunksTogether { kOff, kOn, kAll };
inline const char* ChunksTogetherName(ChunksTogether c) {
  return c == ChunksTogether::kOff ? "off" : c == ChunksTogether::kOn ? "on" : "all";
}

struct ServerOptions {
  // Model and runtime.
  std::string model_path;
  std::string model_alias;          // name shown in /v1/models and responses; default: file stem
  uint32_t ctx_per_lane = 2048;     // -c: the longest prompt + generation one request may use
  int threads = 2;                  // -t
  uint32_t n_batch = 512;           // -b: llama.cpp batch (prefill chunks never exceed it)
  bool flash_attn = false;          // -fa on|off, never llama.cpp's "auto" (skippy-server resolves its default)
                                    // (runtime::MinExactBatch)
  // --exact-min-batch: the long class's smallest batch (0: runtime::MinExactBatch(flash_attn)); the
  // startup batch-split check proves it or turns the cache off.
  uint32_t min_exact_batch = 0;
  uint32_t lane_count = 1;          // --runtime-lane-count
  // On, off, or decided at startup from a measure (Scheduler).
  enum class Switch { kOff, kOn, kAuto };
  // --one-row-class on|off|auto: compute a lone row (a decode step) in the batch kernels' class
  // too (the patch series' one-row class, runtime::OneRowClass): a generated token's KV is then a
  // prompt token's, so a lane keeps an answer for the conversation's next turn, and lanes can step
  // together with one row each. The class makes a lone decode step cost more on some models and
  // less on others (docs/evidence/one-row-class/, docs/evidence/lane-batching-auto/), so "auto"
  // (the default) measures a lone step with and without it at startup (MeasureLoneStep) and keeps
  // it only where it costs at most Scheduler::kLoneStepTolerance more, or kLaneStepTolerance with
  // 2+ lanes that may step together (with a disk tier, the first
  // start's decision is kept there for later ones: class_decision.h). Without the patch series
  // (or with --no-batch-invariant) there is no class: "auto" is off and "on" refused.
  Switch one_row_class = Switch::kAuto;
  // --lane-batching on|off|auto: decode the generated tokens of all busy lanes in one batch
  // (Scheduler, Engine::DecodeStep) when the startup lane-batching check passes. "auto" (the
  // default): with 2+ lanes, wherever the one-row class is on (one row per lane). "on": also
  // where it is not, with a pad row per lane (attention-only models); with the class's "auto" it
  // turns the class on without measuring. "off": one lane at a time.
  Switch lane_batching = Switch::kAuto;
  // --lane-groups: with lane batching, how the decoding lanes of a round are split into steps:
  // "measured" (by what a step of k lanes cost at load, DecodeGroups) or "all" (one step).
  bool lane_groups_measured = true;
  // --ragged-steps on|off: with lanes together, a step of lanes whose ids do not follow each other
  // (0, 2, 3) is one llama_decode computed as one graph (the patch series' ragged split; each lane's
  // row as alone, proved at startup) instead of one graph per run of consecutive ids, each reading
  // every weight. On by default; attention-only and hybrid models with the one-row class
  // (Engine::CanStepLanesApart).
  bool ragged_steps = true;
  // --mixed-steps on|off: with lanes together, decoding lanes step in a prompt chunk's llama_decode
  // (one graph: Engine::DecodeStepWithChunks) where the engine can and the startup check passes.
  // Off by default: measured neutral on the bench models here (docs/evidence/mixed-steps/).
  bool mixed_steps = false;
  // --chunks-together off|on|all: with lanes together, the prompt chunks of several lanes in one
  // turn go into one llama_decode (one graph: Engine::DecodeStepWithChunks) where the engine can and
  // the startup check passes: "on" where that lowers the summed waits (JoinsChunkGroup,
  // prefill_order.h), "all" every chunk the turn runs while they fit a ubatch.
  ChunksTogether chunks_together = ChunksTogether::kOff;
  // Prefill chunking: from the restored prefix, batches of at most prefill_chunk tokens (at least
  // 2 * runtime::MinExactBatch), ending at every planned record boundary.
  uint32_t prefill_chunk = 512;
  // --tpot-slo-ms: while lanes decode, a prefill runs only as many rows at a time as keep every
  // decoding lane's mean time per output token within this (step_budget.h), cutting a planned
  // batch where both pieces keep their class; 0: no bound (a turn prefills up to prefill_chunk rows).
  // Cuts only where the startup batch-split check passes on the model (it runs for this, cache off
  // or not): elsewhere a cut would make an answer depend on the other lanes' traffic.
  double tpot_slo_ms = 0;
  // --ttft-slo-ms: with lanes together, a prefill that can no longer get its first token out
  // within this of its arrival (at the measured cost per row) goes after those that still can
  // (prefill_order.h); 0: no target.
  double ttft_slo_ms = 0;

  // Cache.
  bool cache_enabled = true;        // --no-cache turns it off
  uint64_t cache_ram_mib = 1024;    // byte cap of cached prefixes (ResidentKv charge + KvRecurrent)
  uint32_t cache_entries = 256;     // entry cap
  uint32_t record_stride = 64;      // KvRecurrent record grid (tokens)
  uint32_t max_records = 10;        // exact-boundary records per prompt (KvRecurrent, sliding-window)
  // Also record prompt_end - record_tail (0 or below MinExactBatch: none): a cue like "Next tool
  // call:" that the next request of an agent loop replaces. skippy-server's default: 4 (where
  // llama-server takes its last checkpoint of a hybrid model), 64 with flash attention on.
  uint32_t record_tail = 4;
  // The share of a miss's prefill that the record grid's spread points may cost in extra batches
  // (0: no budget; lane_cache::RecordPolicy::grid_budget), and what one more prefill batch costs
  // in prompt rows (< 0: measured at startup where records are planned, lane_cache::MeasureCutCost).
  // docs/evidence/record-cost/ weighs the default: cold misses at llama-server's speed on models
  // where a batch is dear, against fewer hits where requests diverge inside a prompt.
  double grid_budget = 0.02;
  double cut_cost_rows = -1;
  // After this many milliseconds with no request running or waiting, a lane prefills the answer
  // its last request generated as prompt rows, one batch of at most answer_prefill_rows at a time,
  // and records the exchange, so the conversation's next turn restores the answer too (< 0: never;
  // lane_cache::LaneCache::IdleStep). That is where a decoded token is a batch class of its own
  // (the one-row class off); with the class on the lane keeps the answer as decoded, and idle work
  // prefills only what the next turn holds besides (a reply that tokenizes otherwise, a chat
  // template's end of turn and next header).
  int answer_prefill_idle_ms = 50;
  uint32_t answer_prefill_rows = 16;
  uint32_t decoded_entries = 1024;  // exact-repeat (decoded-result) entries
  uint64_t decoded_ram_mib = 256;
  // Disk tier: entries written through to this directory, read back after a RAM miss or a
  // restart ("" for none), under a byte cap in GiB.
  std::string cache_dir;
  double cache_disk_gib = 8;
  // Shared tier: entries written through to Redis at this host:port and read back when RAM and
  // the disk serve less ("" for none); the password comes from a file or SKIPPY_REDIS_PASSWORD.
  std::string shared_host;
  int shared_port = 6379;
  std::string shared_password;
  std::string shared_key_prefix = "skippy";
  uint32_t shared_timeout_ms = 250;

  // HTTP and limits.
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t queue_size = 16;           // requests waiting for a lane beyond the lanes; then 503
  size_t max_body_bytes = 4u << 20; // larger bodies get 413
  uint32_t max_prompt_tokens = 0;   // 0: ctx_per_lane
  uint32_t max_tokens_limit = 0;    // 0: ctx_per_lane
  int32_t default_max_tokens = -1;  // -1: what the context leaves (llama-server's default)
  int http_threads = 0;             // 0: lanes + queue + 8; always running
  // Connections served at once: the worker pool grows past http_threads up to this (a slow or
  // idle client holds a worker, so a few of them cannot starve /health), and a quarter of it may
  // wait for a worker; a connection beyond both is closed at accept.
  int max_connections = 512;
  // Checked before the work they bound: request headers (count, bytes) before routing, JSON
  // nesting before parsing, chat messages before rendering (431 / 400).
  size_t max_headers = 100;
  size_t max_header_bytes = 64u << 10;
  uint32_t max_json_depth = 32;
  uint32_t max_messages = 256;
  // A socket read or write that makes no progress for this long ends the connection (the
  // header and body of a slow client included).
  int io_timeout_seconds = 10;
  // SIGTERM: in-flight requests get this long to finish, then the process exits anyway.
  int drain_seconds = 10;
  // API keys -> cache namespace ("" = the default namespace). Empty map: no authentication.
  std::map<std::string, std::string> api_keys;
};

}  // namespace skippy::server
