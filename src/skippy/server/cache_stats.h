// The lane cache's stats as skippy-server shows them: the /cache/stats JSON and the /metrics gauges.
#pragma once

#include "nlohmann/json.hpp"
#include "skippy/lane_cache/stats.h"
#include "skippy/server/metrics.h"

namespace skippy::server {

// The cache's part of /cache/stats (the scheduler adds the model's and the startup checks' fields).
nlohmann::json CacheStatsJson(const lane_cache::LaneCacheStats& s);
void FillCacheGauges(const lane_cache::LaneCacheStats& s, Gauges& g);

}  // namespace skippy::server
