#include "skippy/server/step_budget.h"

#include <algorithm>
#include <cmath>

namespace skippy::server {

std::optional<size_t> PrefillRowsWithinTpot(double tpot_slo_ms, std::span<const DecodingLaneClock> lanes,
                                            double decode_ms, double row_ms, size_t min_rows) {
  if (tpot_slo_ms <= 0 || row_ms <= 0) return std::nullopt;
  decode_ms = std::max(decode_ms, 0.0);
  const double least = decode_ms + static_cast<double>(min_rows) * row_ms;
  std::optional<double> allowance;
  for (const DecodingLaneClock& l : lanes) {
    const double a = static_cast<double>(std::max<int64_t>(l.emitted, 1)) * tpot_slo_ms - l.since_first_ms;
    if (a >= least && (!allowance || a < *allowance)) allowance = a;  // below least: late anyway
  }
  if (!allowance) return std::nullopt;
  return static_cast<size_t>(std::floor((*allowance - decode_ms) / row_ms));
}

}  // namespace skippy::server
