// skippy-server: serves one GGUF over HTTP (OpenAI and llama-server endpoints) with the
// exact-prefix cache on every request. Flags follow llama-server where they overlap.
//
//   skippy-server -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [-c 2048] [-t 2]
//       [--runtime-lane-count 1] [--api-key KEY[:NAMESPACE]]... [--no-cache] ...
//
// Exit codes: 0 after a clean stop, 1 when the model cannot be loaded or the port bound, 2 for bad
// flags.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/server/http_server.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

}  // namespace

int main(int argc, char** argv) {
  skippy::server::ServerOptions o;
  std::vector<std::string> api_keys;
  bool no_cache = false;
  std::string flash_attn;  // empty: on with the batch-invariant kernels, off without

  CLI::App app{"skippy-server: OpenAI-compatible serving on llama.cpp with an exact-prefix KV cache"};
  app.add_option("-m,--model", o.model_path, "GGUF model file")->required()->check(CLI::ExistingFile);
  app.add_option("-a,--alias", o.model_alias, "model name in responses (default: the file name)");
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port to listen on")->capture_default_str()->check(CLI::Range(1, 65535));
  app.add_option("-c,--ctx-size", o.ctx_per_lane, "context per request (prompt + generated tokens)")
      ->capture_default_str()->check(CLI::Range(16, 1 << 20));
  app.add_option("-t,--threads", o.threads, "CPU threads")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("-b,--batch-size", o.n_batch, "llama.cpp batch size (at least 128 with flash attention on)")
      ->capture_default_str()->check(CLI::Range(16, 1 << 16));
  app.add_option("--runtime-lane-count,--parallel", o.lane_count, "lanes: requests decoded concurrently, also -np")
      ->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--prefill-chunk", o.prefill_chunk,
                 "largest prefill batch in tokens, at most the batch size (at least 128 with flash attention on)")
      ->capture_default_str()->check(CLI::Range(16, 1 << 16));
  app.add_option("--tpot-slo-ms", o.tpot_slo_ms,
                 "time-per-output-token target: while lanes decode, prefill runs in pieces that keep each decoding "
                 "lane's mean time per token within it (lanes late anyway bound nothing), from the server's own timings "
                 "(exact: a batch is cut only where both pieces keep their batch class); 0: no bound")
      ->capture_default_str()->check(CLI::Range(0.0, 600000.0));
  app.add_option("--ttft-slo-ms", o.ttft_slo_ms,
                 "time-to-first-token target: with lanes together, a prompt that can no longer meet it is prefilled "
                 "after those that still can (a late prompt does not make others late), and with --tpot-slo-ms a "
                 "prompt on time whole that pieces would make late keeps its batch; 0: no target")
      ->capture_default_str()->check(CLI::Range(0.0, 600000.0));
  app.name("skippy-server");
  app.add_option("--flash-attn", flash_attn,
                 "on | off, also -fa (never auto). Default: on with the batch-invariant kernels (a cache hit may prefill "
                 "any suffix of 2+ tokens either way), off without them, where flash attention makes every prefill batch "
                 "keep 64+ rows (README, \"Exactness and batch size\")")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  app.add_option("--api-key", api_keys, "API key, repeatable; KEY:NAMESPACE puts the key's requests in a cache namespace");
  std::string lane_batching = "auto";
  app.add_flag("--lane-batching{on}", lane_batching,
               "--lane-batching=on|off|auto (--lane-batching alone: on). Decode the lanes' generated tokens in one batch; answers "
               "do not depend on the other lanes: every batch size is one class with the one-row class, a pad row per "
               "lane without it (proved at startup). auto, the default: with 2+ lanes, wherever the one-row class is "
               "on; on: also where it is not (a pad row per lane; with 2+ lanes and --one-row-class=auto the class is "
               "then turned on without measuring); off: one lane at a time")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  std::string lane_groups = "measured";
  app.add_option("--lane-groups", lane_groups,
                 "with --lane-batching, which decoding lanes step together: measured (the split whose steps, of "
                 "k lanes each, measured cheapest at startup) or all (every decoding lane in one step)")
      ->capture_default_str()->check(CLI::IsMember({"measured", "all"}));
  std::string ragged_steps = "on";
  app.add_option("--ragged-steps", ragged_steps,
                 "on | off. With lanes stepping together, decoding lanes whose ids do not follow each other (0, 2, 3) "
                 "step in one graph, which reads the weights once for all of them (each lane's row is computed as "
                 "alone, proved at startup); off: one graph per run of consecutive lanes. Attention-only and hybrid "
                 "models with the one-row class")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  std::string mixed_steps = "off";
  app.add_option("--mixed-steps", mixed_steps,
                 "on | off. With lanes stepping together, decoding lanes step in the llama_decode of a prompt chunk "
                 "that does not end its prompt (one graph reads the weights once for both; each lane's rows are "
                 "computed as alone, proved at startup). Attention-only models with the one-row class; hybrids step "
                 "apart from chunks. Off by default: neutral on the bench models measured so far")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  std::string chunks_together = "off";
  app.add_option("--chunks-together", chunks_together,
                 "off | on | all. With lanes stepping together, the prompt chunks of several lanes in one turn go "
                 "into one llama_decode (one graph reads the weights once for all; each lane's rows are computed as "
                 "alone, proved at startup): on, where that lowers their summed waits (a graph's cost against the "
                 "rows its first tokens wait for); all, every chunk the turn runs while they fit a ubatch. "
                 "Attention-only models with the one-row class")
      ->capture_default_str()->check(CLI::IsMember({"off", "on", "all"}));
  std::string one_row_class = "auto";
  app.add_flag("--one-row-class{on}", one_row_class,
               "--one-row-class=on|off|auto (--one-row-class alone: on). Compute a lone row (a decode step) in the "
               "batch kernels' class too (the patch series' one-row class): a generated token's KV is then a prompt "
               "token's, so a lane keeps an answer and records it with its prompt for the conversation's next turn, "
               "and lanes can step together with one row each. A lone decode step costs more in the class on some "
               "models and less on others: auto, the default, measures it at startup and keeps the class only where "
               "it costs at most 3% more, 10% with 2+ lanes that may step together (with --cache-dir, the first start's decision is kept there for later "
               "starts). Pin on or off where two servers must give the same bits: a class measured anew at each "
               "start can differ between starts on a model near the tolerance")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_flag("--no-cache", no_cache, "serve without the prefix cache (same chunking, for comparisons)");
  bool stock_kernels = false;
  app.add_flag("--no-batch-invariant", stock_kernels,
               "use llama.cpp's stock matrix kernels even where the patched build has batch-invariant ones (for "
               "measuring them; on repacked quantized weights the startup check then turns the cache off)");
  app.add_option("--cache-ram", o.cache_ram_mib, "byte cap of cached prefixes, MiB")->capture_default_str();
  app.add_option("--cache-dir", o.cache_dir,
                 "disk tier: cached prefixes are also written to this directory and served from it after a RAM "
                 "eviction or a restart (one server per directory; default: none)");
  app.add_option("--cache-disk-gib", o.cache_disk_gib, "byte cap of the disk tier, GiB")
      ->capture_default_str()->check(CLI::Range(0.0001, 1e6));
  std::string shared_redis, shared_password_file;
  app.add_option("--shared-redis", shared_redis,
                 "shared tier: cached prefixes are also written to the Redis (or Valkey) server at HOST:PORT and "
                 "read from it when RAM and the disk serve less, so replicas of one model share them (default: none)");
  app.add_option("--shared-redis-password-file", shared_password_file,
                 "file whose first line is the Redis password (or set SKIPPY_REDIS_PASSWORD)")
      ->check(CLI::ExistingFile);
  app.add_option("--shared-key-prefix", o.shared_key_prefix, "prefix of every key the shared tier writes")
      ->capture_default_str();
  app.add_option("--shared-timeout-ms", o.shared_timeout_ms,
                 "deadline of each Redis round trip; past it the request recomputes")
      ->capture_default_str()->check(CLI::Range(1, 60000));
  app.add_option("--cache-entries", o.cache_entries, "entry cap of cached prefixes")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--exact-min-batch", o.min_exact_batch,
                 "smallest prefill batch of the long class (default: 2; 64 with flash attention on over stock kernels, "
                 "--no-batch-invariant); for builds "
                 "whose kernels draw the line elsewhere. The startup batch-split check proves it, or the cache is off")
      ->check(CLI::Range(2, 256));
  app.add_option("--cache-record-stride", o.record_stride, "KvRecurrent record grid in tokens")->capture_default_str();
  app.add_option("--cache-max-records", o.max_records, "exact-boundary records per prompt (hybrid and sliding-window models)")->capture_default_str();
  app.add_option("--cache-record-tail", o.record_tail,
                 "hybrid and sliding-window models: also record this many tokens before the prompt end (a cue the "
                 "next request replaces); 0: off. Default 4, as llama-server's last checkpoint (after a long last message, "
                 "at least the smallest batch of its class)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--cache-grid-budget", o.grid_budget,
                 "hybrid and sliding-window models: the share of a miss's prefill time that the record grid's points "
                 "spread over the prompt may cost in extra batches (fewer of them: cheaper misses, fewer hits where "
                 "requests diverge inside a prompt); 0: no budget")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--cache-cut-cost", o.cut_cost_rows,
                 "with --cache-grid-budget: what one more prefill batch costs, in prompt rows (default: measured at "
                 "startup)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--answer-prefill-idle-ms", o.answer_prefill_idle_ms,
                 "after this many ms with no request running or waiting, a lane computes the answer its last request "
                 "generated again as prompt rows and records the exchange, so the conversation's next turn restores the "
                 "answer too (a decoded token is a batch class of its own otherwise; in the one-row class the lane keeps "
                 "the answer as decoded and prefills only what the next turn holds besides); negative: never")
      ->capture_default_str()->check(CLI::Range(-1, 3600000));
  app.add_option("--answer-prefill-rows", o.answer_prefill_rows,
                 "rows per batch of that work at most: a request that arrives meanwhile waits for one batch")
      ->capture_default_str()->check(CLI::Range(4, 1 << 16));
  app.add_option("--cache-decoded-entries", o.decoded_entries, "exact-repeat (decoded-result) entries")->capture_default_str();
  app.add_option("--cache-decoded-ram", o.decoded_ram_mib,
                 "exact-repeat entries byte cap, MiB (default: a quarter of --cache-ram, at most 256)");
  app.add_option("--queue-size", o.queue_size, "requests waiting for a lane before 503")->capture_default_str();
  app.add_option("--max-body-bytes", o.max_body_bytes, "largest request body (413 above)")->capture_default_str();
  app.add_option("--max-prompt-tokens", o.max_prompt_tokens, "largest prompt (0: the context)")->capture_default_str();
  app.add_option("--max-tokens-limit", o.max_tokens_limit, "largest max_tokens (0: the context)")->capture_default_str();
  app.add_option("-n,--n-predict", o.default_max_tokens,
                 "max_tokens when a request gives none (-1: until the end of the sequence or the context)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  app.add_option("--http-threads", o.http_threads, "HTTP worker threads (0: lanes + queue + 8)")->capture_default_str();
  app.add_option("--max-connections", o.max_connections,
                 "connections served at once (workers grow past --http-threads up to this; a quarter more wait; "
                 "then closed at accept)")
      ->capture_default_str()->check(CLI::Range(8, 65536));
  app.add_option("--max-headers", o.max_headers, "request headers at most (431 above)")->capture_default_str()
      ->check(CLI::Range(8, 10000));
  app.add_option("--max-header-bytes", o.max_header_bytes, "bytes of request headers at most (431 above)")
      ->capture_default_str()->check(CLI::Range(1024, 1 << 24));
  app.add_option("--max-json-depth", o.max_json_depth, "nesting of a JSON body at most (400 above)")
      ->capture_default_str()->check(CLI::Range(4, 1024));
  app.add_option("--max-messages", o.max_messages, "chat messages per request at most (400 above)")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--io-timeout", o.io_timeout_seconds, "seconds a socket read or write may stall, and a request's head may take in all")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--drain-seconds", o.drain_seconds, "on SIGTERM, seconds in-flight requests get before exit")
      ->capture_default_str()->check(CLI::Range(0, 3600));
  // llama-server spells them -fa and -np; CLI11 takes one-letter short names only.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::string& a : args) {
    if (a == "-fa") a = "--flash-attn";
    if (a == "-np") a = "--parallel";
  }
  std::reverse(args.begin(), args.end());  // CLI11 parses a vector from its back
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  o.cache_enabled = !no_cache;
  o.lane_groups_measured = lane_groups == "measured";
  o.ragged_steps = ragged_steps == "on";
  o.mixed_steps = mixed_steps == "on";
  o.chunks_together = chunks_together == "all"  ? skippy::server::ChunksTogether::kAll
                      : chunks_together == "on" ? skippy::server::ChunksTogether::kOn
                                                : skippy::server::ChunksTogether::kOff;
  using Switch = skippy::server::ServerOptions::Switch;
  auto switch_of = [](const std::string& v) { return v == "on" ? Switch::kOn : v == "off" ? Switch::kOff : Switch::kAuto; };
  o.lane_batching = switch_of(lane_batching);
  o.one_row_class = switch_of(one_row_class);
  if (stock_kernels) skippy::runtime::SetBatchInvariant(false);
  if (o.one_row_class == Switch::kOn && stock_kernels) {
    std::fprintf(stderr, "skippy-server: --one-row-class=on needs the batch-invariant kernels (not --no-batch-invariant)\n");
    return 2;
  }
  // "auto" leaves the class to the scheduler, which measures what it costs on the loaded model
  // (until then every check here holds the stricter rules of the default classes). Lanes that
  // step together whatever it costs (--lane-batching=on) take it without a measure.
  const bool class_for_lanes = o.one_row_class == Switch::kAuto && o.lane_batching == Switch::kOn && o.lane_count >= 2;
  if (!stock_kernels && (o.one_row_class == Switch::kOn || class_for_lanes)) {
    // Lane batching falls back to a pad row per lane on a build without the class; an explicit
    // --one-row-class=on has no fallback.
    if (!skippy::runtime::SetOneRowClass(true) && o.one_row_class == Switch::kOn) {
      std::fprintf(stderr, "skippy-server: --one-row-class: this llama.cpp build has no one-row class (patch series)\n");
      return 2;
    }
  }
  // Resolved here, once, before any context exists: never llama.cpp's "auto", which could resolve
  // differently in two contexts (state blobs carry the V layout).
  if (flash_attn.empty()) flash_attn = skippy::runtime::BatchInvariant() ? "on" : "off";
  o.flash_attn = flash_attn == "on";
  // Every long batch keeps runtime::MinExactBatch rows (2; 64 with flash attention on over the
  // stock kernels), so a chunk must hold two of them; a tail record leaves at least a short batch
  // (2 rows).
  const uint32_t min_batch =
      static_cast<uint32_t>(skippy::runtime::MinExactBatch(o.flash_attn, o.min_exact_batch));
  if (o.n_batch < 2 * min_batch || o.prefill_chunk < 2 * min_batch) {
    std::fprintf(stderr, "skippy-server: -b and --prefill-chunk must be at least %u with flash attention %s\n",
                 2 * min_batch, flash_attn.c_str());
    return 2;
  }
  // Decoded results (a vocabulary of logits each) count against the memory the operator gave the
  // cache: by default a quarter of --cache-ram, so --cache-ram bounds everything cached.
  if (app.count("--cache-decoded-ram") == 0) {
    o.decoded_ram_mib = std::clamp<uint64_t>(o.cache_ram_mib / 4, 1, 256);
  }
  if (o.record_tail == 1) {
    std::fprintf(stderr, "skippy-server: --cache-record-tail must be 0 or at least 2 (a one-row batch is a class of its own)\n");
    return 2;
  }
  if (!shared_redis.empty()) {
    const size_t colon = shared_redis.rfind(':');
    int port = 0;
    const std::string port_text = colon == std::string::npos ? "" : shared_redis.substr(colon + 1);
    const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (colon == 0 || colon == std::string::npos || ec != std::errc() || end != port_text.data() + port_text.size() ||
        port < 1 || port > 65535) {
      std::fprintf(stderr, "skippy-server: --shared-redis must be HOST:PORT, got '%s'\n", shared_redis.c_str());
      return 2;
    }
    o.shared_host = shared_redis.substr(0, colon);
    o.shared_port = port;
    if (const char* env = std::getenv("SKIPPY_REDIS_PASSWORD")) o.shared_password = env;
    if (!shared_password_file.empty()) {
      std::ifstream in(shared_password_file);
      if (!in || !std::getline(in, o.shared_password)) {
        std::fprintf(stderr, "skippy-server: cannot read %s\n", shared_password_file.c_str());
        return 2;
      }
    }
  }
  for (const std::string& k : api_keys) {
    const size_t colon = k.find(':');
    const std::string key = k.substr(0, colon);
    if (key.empty()) {
      std::fprintf(stderr, "skippy-server: --api-key must not be empty\n");
      return 2;
    }
    o.api_keys[key] = colon == std::string::npos ? "" : k.substr(colon + 1);
  }

  std::signal(SIGPIPE, SIG_IGN);
  skippy::server::HttpServer server(o);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // SIGINT/SIGTERM stop the server; in-flight requests get --drain-seconds, then the process exits
  // whatever a client still holds open.
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!g_stop && !done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done) return;
    server.Stop();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.drain_seconds);
    while (!done && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done) {
      std::fprintf(stderr, "skippy-server: exiting after a %d s drain with connections still open\n", o.drain_seconds);
      std::_Exit(0);
    }
  });
  const absl::Status s = server.Run();
  done = true;
  watcher.join();
  if (!s.ok()) {
    std::fprintf(stderr, "skippy-server: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
