#include "skippy/server/step_budget.h"

#include <algorithm>
#include <cmath>

namespace skippy::server {

std::optional<size_t> PrefillRowsWithinTpot(double tpot_slo_ms, std::span<const DecodingLaneClock> lanes,
                                            double decode_ms, double row_ms, size_t min_rows) {
  if (tpot_slo_ms <= 0 || row_ms <= 0) return std::nullopt;
  decode_ms = std::max(decode_ms, 0.0);
  const double least = decode_ms + static_cast<double>(min_rows) * row_ms;  // a step with the smallest piece
  std::optional<double> allowance;
  for (const DecodingLaneClock& l : lanes) {
    const int64_t emitted = std::max<int64_t>(l.emitted, 1), remaining = std::max<int64_t>(l.remaining, 0);
    // Its last token's deadline against the soonest it can come: late anyway when that misses.
    const double last_slack = static_cast<double>(emitted + remaining - 1) * tpot_slo_ms - l.since_first_ms -
                              static_cast<double>(remaining) * least;
    if (remaining == 0 || last_slack < 0) continue;
    const double a = static_cast<double>(emitted) * tpot_slo_ms - l.since_first_ms;
    if (!allowance || a < *allowance) allowance = a;
  }
  if (!allowance) return std::nullopt;
  const double rows = std::floor((*allowance - decode_ms) / row_ms);
  return rows > static_cast<double>(min_rows) ? static_cast<size_t>(rows) : min_rows;
}

bool TtftOutranksTpot(double ttft_left_ms, size_t rows_left, size_t piece_rows, double row_ms, double decode_ms) {
  const double whole_ms = static_cast<double>(rows_left) * row_ms;
  if (whole_ms > ttft_left_ms) return false;  // late anyway
  const size_t pieces = (rows_left + std::max<size_t>(piece_rows, 1) - 1) / std::max<size_t>(piece_rows, 1);
  return whole_ms + static_cast<double>(pieces) * std::max(decode_ms, 0.0) > ttft_left_ms;
}

}  // namespace skippy::server
