#include "skippy/bench/use_case_corpus.h"

#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "skippy/common/strings.h"

namespace skippy::bench {

using nlohmann::json;

namespace {

template <typename T>
StatusOr<T> Field(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) {
    return absl::InvalidArgumentError(StrCat("use-case corpus: ", where, " is missing \"", key, "\""));
  }
  try {
    return obj.at(key).get<T>();
  } catch (const json::exception&) {
    return absl::InvalidArgumentError(StrCat("use-case corpus: ", where, " has a mistyped \"", key, "\""));
  }
}

}  // namespace

StatusOr<std::vector<UseCase>> ParseUseCaseCorpus(const std::string& text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("use-case corpus: not valid JSON");
  SKIPPY_ASSIGN_OR_RETURN(int version, Field<int>(doc, "version", "the document"));
  if (version != 1) return absl::InvalidArgumentError(StrCat("use-case corpus: unsupported version ", version));
  if (!doc.contains("use_cases") || !doc["use_cases"].is_array()) {
    return absl::InvalidArgumentError("use-case corpus: the document is missing the \"use_cases\" array");
  }
  std::vector<UseCase> out;
  for (size_t i = 0; i < doc["use_cases"].size(); ++i) {
    const json& u = doc["use_cases"][i];
    const std::string where = StrCat("use case #", i);
    UseCase c;
    SKIPPY_ASSIGN_OR_RETURN(c.key, Field<std::string>(u, "key", where));
    const std::string named = StrCat("use case '", c.key, "'");
    SKIPPY_ASSIGN_OR_RETURN(c.label, Field<std::string>(u, "label", named));
    SKIPPY_ASSIGN_OR_RETURN(c.prefix_tokens, Field<int32_t>(u, "prefix_tokens", named));
    SKIPPY_ASSIGN_OR_RETURN(c.prompt, Field<std::string>(u, "prompt", named));
    SKIPPY_ASSIGN_OR_RETURN(json source, Field<json>(u, "source", named));
    const std::string src = named + " source";
    SKIPPY_ASSIGN_OR_RETURN(c.dataset, Field<std::string>(source, "dataset", src));
    SKIPPY_ASSIGN_OR_RETURN(c.config, Field<std::string>(source, "config", src));
    SKIPPY_ASSIGN_OR_RETURN(c.split, Field<std::string>(source, "split", src));
    SKIPPY_ASSIGN_OR_RETURN(c.row_idx, Field<int64_t>(source, "row_idx", src));
    if (c.key.empty() || c.prompt.empty() || c.prefix_tokens < 1) {
      return absl::InvalidArgumentError(StrCat("use-case corpus: ", named, " has an empty key/prompt or prefix_tokens < 1"));
    }
    for (const UseCase& prev : out) {
      if (prev.key == c.key) return absl::InvalidArgumentError(StrCat("use-case corpus: duplicate key '", c.key, "'"));
    }
    out.push_back(std::move(c));
  }
  if (out.empty()) return absl::InvalidArgumentError("use-case corpus: no use cases");
  return out;
}

StatusOr<std::vector<UseCase>> LoadUseCaseCorpus(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("cannot read use-case corpus ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseUseCaseCorpus(ss.str());
}

StatusOr<std::vector<UseCase>> SelectUseCases(const std::vector<UseCase>& corpus, const std::string& which) {
  if (which == "all") return corpus;
  std::vector<std::string> keys;
  for (const UseCase& c : corpus) {
    if (c.key == which) return std::vector<UseCase>{c};
    keys.push_back(c.key);
  }
  return absl::NotFoundError(StrCat("unknown use case '", which, "'; known: ", fmt::format("{}", fmt::join(keys, ", ")), ", all"));
}

}  // namespace skippy::bench
