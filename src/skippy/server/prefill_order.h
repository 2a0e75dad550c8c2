// Prefill order: which lane's prefill chunk runs next when lanes decode together
// (--lane-batching, Scheduler::StepTogether runs one chunk between two steps of the decoding lanes).
//
// Rule: the lane with the fewest chunks left goes first, the first admitted of equals; a lane that
// has been passed over `overdue` times in a row goes before the others (the first admitted of
// those). Fewest chunks left: a hit's suffix or a short prompt does not wait for a long prefill,
// and of a burst of cold prompts the first admitted gets its first token first instead of all of
// them last, as they would taking turns. Chunks, not tokens: jobs of about the same size keep the
// order they came in, so clients that come back apart stay apart. Passed over: a long prompt is
// not starved by a stream of short ones.
//
// Thread-safety: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace skippy::server {

struct PrefillCandidate {
  size_t chunks_left = 0;   // prefill chunks still to run (at least 1)
  uint64_t admitted = 0;    // admission order: lower came first
  size_t passed_over = 0;   // chunks given to other lanes since this lane's last one
};

// The index in `candidates` of the lane whose chunk runs next; nullopt when there is none.
std::optional<size_t> NextPrefill(std::span<const PrefillCandidate> candidates, size_t overdue);

}  // namespace skippy::server
