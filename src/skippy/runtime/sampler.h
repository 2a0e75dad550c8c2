// Sampling the next token from last-position logits, and the vocabulary facts generation needs.
//
// Sampler works on a logits vector, not on a llama_context, so the same code samples from freshly
// decoded logits and from a decoded-result cache entry (an exact repeat): for equal logits and an
// equal seed, the sampled sequence is equal.
//   - temperature <= 0: greedy, the lowest token id among the maxima (deterministic, no RNG).
//   - temperature > 0: llama.cpp's sampler chain top_k -> top_p -> min_p -> temperature -> dist(seed).
// A Sampler is stateful (its RNG advances per sample); one per request.
//
// Thread-safety: a Sampler is used by one thread at a time; the free functions read an immutable
// Model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "skippy/common/status.h"
#include "skippy/runtime/model.h"

struct llama_sampler;

namespace skippy::runtime {

struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 40;      // <= 0: off
  float top_p = 1.0f;      // >= 1: off
  float min_p = 0.0f;      // <= 0: off
  uint32_t seed = 0;
};

class Sampler {
 public:
  // InvalidArgument for a negative temperature, top_p outside [0, 1] or min_p outside [0, 1].
  [[nodiscard]] static StatusOr<std::unique_ptr<Sampler>> Create(const SamplingParams& params);
  // Create's checks alone (a server runs them before it answers 200).
  [[nodiscard]] static Status Validate(const SamplingParams& params);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // REQUIRES: logits non-empty (one value per vocabulary entry).
  Token Sample(std::span<const float> logits);
  bool greedy() const { return chain_ == nullptr; }

 private:
  Sampler() = default;
  llama_sampler* chain_ = nullptr;  // nullptr for greedy
};

// True for end-of-generation tokens (EOS, EOT, ...). False for ids outside the vocabulary.
bool IsEndOfGeneration(const Model& model, Token token);
// The text of one token (special tokens rendered as text when `special`). InvalidArgument for an
// id outside the vocabulary.
[[nodiscard]] StatusOr<std::string> TokenPiece(const Model& model, Token token, bool special = false);

}  // namespace skippy::runtime
