// Paths the runtime tests use; compile definitions from the build, overridable by environment.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "skippy/common/strings.h"

namespace skippy::testing_env {

inline std::string ZooDir() {
  if (const char* v = std::getenv("SKIPPY_ZOO_DIR")) return v;
  return SKIPPY_TEST_ZOO_DIR;
}
inline std::string ZooFile(std::string_view key) { return StrCat(ZooDir(), "/", key, ".gguf"); }
inline std::string VocabDir() { return SKIPPY_TEST_VOCAB_DIR; }
inline std::string CorrectnessBin() { return SKIPPY_TEST_CORRECTNESS_BIN; }

inline constexpr const char* kPrompt =
    "You are a careful assistant. Summarize the following design note in two sentences: the cache "
    "keeps attention state for shared prefixes and restores it exactly.";

}  // namespace skippy::testing_env
