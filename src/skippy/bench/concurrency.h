// Concurrency sweep against llama-server: for each level c, llama-server runs with --parallel c and
// c client threads send `concurrent_requests` streamed completions in total (distinct prompts that
// share the benchmark prefix). Per request: TTFT and TPOT at the client; per level: percentiles,
// throughput, and goodput (requests per second served without an error that met both SLOs). Written to
// OUT/concurrency-sweep.json. Skippy's side of the sweep comes with skippy-server.
#pragma once

#include "nlohmann/json.hpp"
#include "skippy/bench/production.h"
#include "skippy/common/status.h"

namespace skippy::bench {

// The sweep's options alone (levels in [1, 64], at least one request), so a caller can refuse them
// before other work.
[[nodiscard]] Status CheckConcurrencySweep(const ProductionOptions& options);

StatusOr<nlohmann::json> RunConcurrencySweep(const ProductionOptions& options);

}  // namespace skippy::bench
