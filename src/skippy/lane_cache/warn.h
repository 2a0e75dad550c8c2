// How the lane cache reports what it skipped (a failed export, lookup or import): one line on
// stderr. The request is still served; these are never errors to a client.
#pragma once

#include <cstdio>
#include <string>

#include "skippy/common/status.h"

namespace skippy::lane_cache {

inline void Warn(const char* what, const Status& s) {
  std::fprintf(stderr, "skippy lane cache: %s: %s\n", what, std::string(s.message()).c_str());
}

}  // namespace skippy::lane_cache
