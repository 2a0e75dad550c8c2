#include "skippy/server/step_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace skippy::server {

std::optional<size_t> PrefillRowsWithinTpot(double tpot_slo_ms, std::span<const DecodingLaneClock> lanes,
                                            double decode_ms, double row_ms) {
  if (tpot_slo_ms <= 0 || lanes.empty() || row_ms <= 0) return std::nullopt;
  double allowance = std::numeric_limits<double>::infinity();
  for (const DecodingLaneClock& l : lanes) {
    allowance = std::min(allowance, static_cast<double>(std::max<int64_t>(l.emitted, 1)) * tpot_slo_ms - l.since_first_ms);
  }
  const double prefill_ms = allowance - std::max(decode_ms, 0.0);
  if (!(prefill_ms > 0)) return 0;
  return static_cast<size_t>(std::floor(prefill_ms / row_ms));
}

}  // namespace skippy::server
