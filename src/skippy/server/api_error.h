// Client-visible errors: an HTTP status plus an OpenAI-style body
//   {"error": {"message": "...", "type": "...", "code": "..."}}
// and the mapping from skippy's Status codes (common/status.h) to them.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"

namespace skippy::server {

struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string code = "invalid_request";
  std::string message;

  nlohmann::json Body() const {
    return {{"error", {{"message", message}, {"type", type}, {"code", code}}}};
  }
};

inline ApiError BadRequest(std::string message, std::string code = "invalid_request") {
  return ApiError{400, "invalid_request_error", std::move(code), std::move(message)};
}

// InvalidArgument -> 400, NotFound -> 404, FailedPrecondition -> 409, ResourceExhausted -> 503,
// Unimplemented -> 501, anything else -> 500 (server_error).
inline ApiError FromStatus(const Status& s) {
  std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument: return BadRequest(msg);
    case absl::StatusCode::kNotFound: return ApiError{404, "invalid_request_error", "not_found", msg};
    case absl::StatusCode::kFailedPrecondition: return ApiError{409, "invalid_request_error", "failed_precondition", msg};
    case absl::StatusCode::kResourceExhausted: return ApiError{503, "server_error", "overloaded", msg};
    case absl::StatusCode::kUnimplemented: return ApiError{501, "invalid_request_error", "unsupported", msg};
    default: return ApiError{500, "server_error", "internal_error", msg};
  }
}

}  // namespace skippy::server
