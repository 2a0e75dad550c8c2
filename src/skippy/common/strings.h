// String building for messages and keys. Debian's abseil is built with its own absl::string_view
// (not std::string_view), so absl::StrCat does not take std::string_view; these thin wrappers over
// {fmt} take anything fmt can format, std::string_view included.
#pragma once

#include <iterator>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

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
