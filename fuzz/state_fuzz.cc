// Fuzz target: bytes as a sequence-state import would receive them (a stored payload, a spilled
// entry), through Skippy's own parsers of the llama.cpp state layout: the KV block parser, the
// padder that rewrites a sliding-window export, and the hybrid recurrent-part locator and
// rebuilder. None may crash or read out of bounds; a padded blob must parse again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <span>
#include <vector>

#include "skippy/runtime/sequence_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  auto shapes = skippy::runtime::ParseKvSequenceState(bytes);
  static const std::vector<int32_t> tokens = [] {
    std::vector<int32_t> t(256);
    std::iota(t.begin(), t.end(), 0);
    return t;
  }();
  auto padded = skippy::runtime::PadToPositionZero(bytes, tokens);
  if (padded.ok() && !skippy::runtime::ParseKvSequenceState(*padded).ok()) std::abort();
  // A blob that parses is padded, unless the tokens given are too few (InvalidArgument).
  if (shapes.ok() && !padded.ok() && padded.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  auto offset = skippy::runtime::HybridRecurrentOffset(bytes);
  if (offset.ok() && *offset > size) std::abort();
  if (size > 8) {
    const size_t n = data[0];
    const size_t cut = 8 + data[1] % (size - 8);
    (void)skippy::runtime::HybridStateAt(bytes, n, bytes.subspan(cut));
  }
  return 0;
}
