// Small summary statistics and timing helpers shared by the certifier and the benchmarks.
// Header-only; no allocation beyond the copy each function takes.
#pragma once

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

namespace skippy {

using SteadyClock = std::chrono::steady_clock;

// Milliseconds from t0 to now.
inline double MsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
}

// Linear-interpolated percentile, q in [0, 1]; 0 for an empty input.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double idx = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

// Median (mean of the two middle values for an even count); 0 for an empty input.
inline double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

inline double Mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace skippy
