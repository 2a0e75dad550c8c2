// Shared helpers for the cache core tests.
#pragma once

#include <string>
#include <vector>

#include "skippy/cache/prefix_identity.h"

namespace skippy::cache::testing {

inline PrefixScope MakeScope(std::string ns = "", int32_t n_vocab = 1000, std::string model = "model-a") {
  PrefixScope s;
  s.config.model_id = std::move(model);
  s.config.layer_begin = 0;
  s.config.layer_end = 16;
  s.config.runtime_abi = "skippy-rt-1";
  s.config.llama_version = "b0000";
  s.config.n_ctx = 8192;
  s.config.n_vocab = n_vocab;
  s.cache_namespace = std::move(ns);
  return s;
}

inline std::vector<Token> Seq(std::initializer_list<Token> t) { return std::vector<Token>(t); }

inline std::vector<Token> Range(Token from, Token to) {
  std::vector<Token> v;
  for (Token t = from; t < to; ++t) v.push_back(t);
  return v;
}

}  // namespace skippy::cache::testing
