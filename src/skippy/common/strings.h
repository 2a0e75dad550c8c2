// String building for messages and keys. Debian's abseil is built with its own absl::string_view
// (not std::string_view), so absl::StrCat does not take std::string_view; these thin wrappers over
// {fmt} take anything fmt can format, std::string_view included.
#pragma once

#include <iterator>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "absl/strings/string_view.h"

#if !defined(ABSL_USES_STD_STRING_VIEW)
// absl::string_view (what absl::Status::message() returns) formats like any other string.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};
#endif

namespace skippy {

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (fmt::format_to(std::back_inserter(out), "{}", args), ...);
  return out;
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  (fmt::format_to(std::back_inserter(*out), "{}", args), ...);
}

}  // namespace skippy
