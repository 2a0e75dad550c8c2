// skippy-bench fleet: N skippy-server replicas sharing a Redis tier behind skippy-router
// (cache-aware) against N llama-servers behind the same router in round-robin mode (a plain
// balancer), same model, threads and per-request context, on interleaved-prefixes (more documents
// than one replica's cache holds), multi-turn and agent-loop. Clients run concurrently, one per
// replica, each sending its streams' requests in workload order.
//
// Besides TTFT per side it measures, for Skippy:
//   - fleet reuse: prompt tokens the fleet restored, against one skippy-server whose cache holds
//     everything (the same workload, sequential): the target is at least 90%;
//   - a restarted replica: the first hits on prefixes recorded before the restart (from the shared
//     tier) against hits from its own RAM, asked directly (target: within 2x);
//   - faults: Redis killed and restarted, and a replica killed, mid-run; every answer compared with
//     the single server's answer for the same request (greedy): none may differ, and every request
//     is answered, retried or counted.
// Output: fleet.json and fleet.md in output_dir.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/bench/workloads.h"
#include "skippy/common/status.h"

namespace skippy::bench {

struct FleetOptions {
  std::string output_dir;
  std::string case_key = "llama";
  std::vector<std::string> workloads = {"interleaved-prefixes", "multi-turn", "agent-loop"};
  WorkloadOptions workload;
  int replicas = 3;
  int threads = 1;
  int ctx_size = 4096;
  int batch_size = 512;
  bool flash_attn = false;
  // Each skippy replica's RAM for prefixes, MiB: small enough that one replica cannot hold every
  // document of interleaved-prefixes (0: skippy-server's default).
  int replica_cache_mib = 0;
  int repeats = 1;
  bool faults = true;
  std::string skippy_server_bin;
  std::string skippy_router_bin;
  std::string llama_server_bin;
  std::string redis_server_bin = "redis-server";
  std::string model_dir;
  std::string zoo_dir;
  std::string zoo_format = "F16";
  int server_startup_timeout_secs = 120;
  int request_timeout_secs = 300;
};

StatusOr<nlohmann::json> RunFleet(const FleetOptions& options);

}  // namespace skippy::bench
