// The use-case corpus (evals/skippy-usecase-corpus.json): prompts in the spirit of one row of a
// public dataset each, with the source coordinates kept. Format:
//   {"version": 1, "use_cases": [{"key", "label", "prefix_tokens", "source": {"dataset", "config",
//    "split", "row_idx"}, "prompt"}]}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "skippy/common/status.h"

namespace skippy::bench {

struct UseCase {
  std::string key;
  std::string label;
  int32_t prefix_tokens = 128;
  std::string dataset, config, split;
  int64_t row_idx = 0;
  std::string prompt;
};

// InvalidArgument naming the missing or mistyped key (and the use case) for a malformed corpus;
// NotFound for a missing file.
StatusOr<std::vector<UseCase>> LoadUseCaseCorpus(const std::string& path);
StatusOr<std::vector<UseCase>> ParseUseCaseCorpus(const std::string& json_text);

// "all" selects every use case; otherwise a key. NotFound lists the known keys.
StatusOr<std::vector<UseCase>> SelectUseCases(const std::vector<UseCase>& corpus, const std::string& which);

}  // namespace skippy::bench
