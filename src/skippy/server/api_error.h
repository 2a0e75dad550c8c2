// Client-visible errors: an HTTP status plus an OpenAI-style body
//   {"error": {"message": "...", "type": "...", "code": "..."}}
// and the mapping from skippy's Status codes (common/status.h) to them. A Status may carry its
// API error code as a payload (ApiStatus): the HTTP layer reads the code from there, never from
// the message text.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "absl/strings/cord.h"
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

// The payload key of an API error code on a Status.
inline constexpr char kApiCodeUrl[] = "skippy/api-error-code";

// A Status whose client-visible code is `api_code` ("unknown_field", "context_length_exceeded" ...).
inline Status ApiStatus(absl::StatusCode code, const std::string& api_code, const std::string& message) {
  Status s(code, message);
  s.SetPayload(kApiCodeUrl, absl::Cord(api_code));
  return s;
}
inline Status InvalidRequest(const std::string& api_code, const std::string& message) {
  return ApiStatus(absl::StatusCode::kInvalidArgument, api_code, message);
}
// The code ApiStatus attached, if any.
inline std::optional<std::string> ApiCodeOf(const Status& s) {
  auto p = s.GetPayload(kApiCodeUrl);
  if (!p) return std::nullopt;
  return std::string(*p);
}

// InvalidArgument -> 400, NotFound -> 404, FailedPrecondition -> 409, ResourceExhausted -> 503,
// Unimplemented -> 501, anything else -> 500 (server_error). The code is the Status's API code
// when it has one, else `fallback_code` for a 400 and the status's own name otherwise.
inline ApiError FromStatus(const Status& s, std::string_view fallback_code = "invalid_request") {
  std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument: return BadRequest(msg, ApiCodeOf(s).value_or(std::string(fallback_code)));
    case absl::StatusCode::kNotFound: return ApiError{404, "invalid_request_error", "not_found", msg};
    case absl::StatusCode::kFailedPrecondition: return ApiError{409, "invalid_request_error", "failed_precondition", msg};
    case absl::StatusCode::kResourceExhausted: return ApiError{503, "server_error", "overloaded", msg};
    case absl::StatusCode::kUnimplemented: return ApiError{501, "invalid_request_error", "unsupported", msg};
    default: return ApiError{500, "server_error", "internal_error", msg};
  }
}

}  // namespace skippy::server
