// Logit comparisons the certifiers share: exactness is byte equality, never a tolerance.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "skippy/runtime/model.h"

namespace skippy::certify {

// Two empty vectors are equal (memcmp is not called on their null data).
inline bool BytesEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The greedy token. REQUIRES: logits non-empty.
inline runtime::Token Argmax(const std::vector<float>& logits) {
  return static_cast<runtime::Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace skippy::certify
