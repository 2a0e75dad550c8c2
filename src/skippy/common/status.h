// Errors are values across Skippy: every fallible call returns absl::Status or absl::StatusOr<T>.
// This header fixes which codes mean what, so a caller (and an exit-code or HTTP mapping) can act
// on them without parsing messages:
//   InvalidArgument     bad input from a user or client (bad prompt, bad flag, bad request body)
//   NotFound            a file, entry or family that does not exist
//   FailedPrecondition  a valid request the current state or policy refuses (disabled family,
//                       payload kind not allowed for the family, pinned entry)
//   ResourceExhausted   a cap or a bounded queue is full
//   DataLoss            a file or stored payload is corrupt or truncated
//   Unimplemented       a valid request this build cannot run (for example a partial layer range)
//   Internal            a broken invariant in Skippy or an unexpected llama.cpp failure
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace skippy {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

}  // namespace skippy

// Propagates a non-OK status to the caller.
#define SKIPPY_RETURN_IF_ERROR(expr)              \
  do {                                            \
    ::absl::Status _skippy_status = (expr);       \
    if (!_skippy_status.ok()) return _skippy_status; \
  } while (0)

#define SKIPPY_CONCAT_INNER_(a, b) a##b
#define SKIPPY_CONCAT_(a, b) SKIPPY_CONCAT_INNER_(a, b)
// Assigns the value of a StatusOr to lhs or returns its status.
#define SKIPPY_ASSIGN_OR_RETURN(lhs, expr) \
  SKIPPY_ASSIGN_OR_RETURN_IMPL_(SKIPPY_CONCAT_(_skippy_or_, __LINE__), lhs, expr)
#define SKIPPY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
