// The synthetic model zoo: one table row per model family (the README's family table).
//
// A family's identity (key, display name, llama.cpp architecture, memory kind, production payload)
// is its row in the cache core's family table (skippy/cache/family_policy.h). A zoo row adds what
// is needed to write a synthetic GGUF of it: the tokenizer file copied from the pinned llama.cpp
// tree, a seed, and per-preset dimensions from which the architecture's GGUF metadata is derived.
// Adding a family is one row there and one row here; nothing else switches on family keys.
//
// This layer knows nothing about llama.cpp types: metadata is a list of (key, value) pairs with the
// GGUF key spelled as llama.cpp reads it (see src/llama-arch.cpp in the pinned tree). The runtime
// adapter turns a row into a file (src/skippy/runtime/synthetic_model.h).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "skippy/cache/family_policy.h"
#include "skippy/common/status.h"

namespace skippy::zoo {

// kSmall: a few families at tiny depth with matrix widths of 256, the block size of the K-quants,
// so that their quantized variants (QuantFormat) really hold Q4_K, Q6_K ... tensors; tiny widths
// make llama-quantize fall back to other types. Used by the quantized-format tests.
enum class Preset { kTiny, kBench, kReal, kSmall };
std::string_view PresetName(Preset preset);
StatusOr<Preset> ParsePreset(std::string_view name);

// One GGUF metadata value. Arrays are uint32 only (per-layer patterns and counts).
using MetaValue = std::variant<uint32_t, int32_t, float, bool, std::string, std::vector<uint32_t>>;
struct MetaEntry {
  std::string key;  // full GGUF key, e.g. "qwen3.attention.head_count"
  MetaValue value;
};
using Metadata = std::vector<MetaEntry>;

// Shape knobs a preset sets for a family. Zero means "not used by this family".
struct Dims {
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;     // attention head size (full-attention layers)
  uint32_t n_ff = 0;         // dense FFN width
  uint32_t n_ctx_train = 4096;
  // Mixture of experts.
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint32_t n_ff_exp = 0;
  uint32_t n_expert_shared = 0;
  // Recurrent (Mamba2 / gated delta-net) layers.
  uint32_t ssm_d_state = 0;
  uint32_t ssm_n_group = 0;
  uint32_t ssm_dt_rank = 0;  // number of SSM heads
  uint32_t ssm_d_inner = 0;
  // Sliding-window attention.
  uint32_t n_swa = 0;
  uint32_t swa_period = 0;
  uint32_t head_dim_swa = 0;
  // Multi-head latent attention (DeepSeek2 shape).
  uint32_t q_lora_rank = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t rope_dim = 0;     // rotary dims (MLA rope part, or partial rotary)
  uint32_t qk_nope_dim = 0;
  uint32_t v_head_dim = 0;
  uint32_t n_dense_lead = 0;
  // Gemma4 per-layer embeddings.
  uint32_t n_embd_per_layer = 0;
};

struct FamilySpec {
  std::string_view key;           // the family-table key: file name, JSON key, CLI --case
  std::string_view arch_note;     // what the real model has (MLA + MoE, SWA, hybrid ...)
  std::string_view model_ref;     // representative real GGUF (the README's family table)
  std::string_view vocab;         // models/ggml-vocab-<vocab>.gguf in the llama.cpp tree
  std::string_view vocab_note;    // empty when it is the family's real tokenizer, else why a stand-in
  uint64_t seed;
  Dims tiny;
  Dims bench;
  std::optional<Dims> real;       // real hyperparameters when the model fits this machine
  std::string_view real_note;     // provenance of the real preset's numbers
  std::string_view ref_format;    // weight format of model_ref (llama-quantize's name: Q4_K_M, IQ2_XS ...)
  std::optional<Dims> small;      // the kSmall preset, for the families the quantized tests use
  // Adds the architecture's metadata for the given dims (common keys are added by the caller).
  void (*arch_metadata)(const Dims& dims, std::string_view arch, Metadata& out);
  // Tests only: write this family's shape under another (uncertified) architecture name.
  std::string_view arch_override = {};

  // The family-table row for `key` (every zoo row has one; a test checks it).
  const cache::FamilyRow& row() const;
  std::string_view arch() const { return arch_override.empty() ? row().arch : arch_override; }
  std::string_view display_name() const { return row().display_name; }
};

// All families in evidence order (the README's family table), DeepSeek3 last.
std::span<const FamilySpec> Families();
// NotFound with the list of known keys when `key` is not a family.
StatusOr<const FamilySpec*> FindFamily(std::string_view key);
// Dims for a preset; NotFound when the family has no such preset (only kReal and kSmall can be absent).
StatusOr<Dims> DimsFor(const FamilySpec& family, Preset preset);

// The file a zoo directory holds for a family in a weight format: "<key>.gguf" for F16 (what the
// generator writes; also for an empty format), "<key>.<FORMAT>.gguf" for a quantized one.
// "ref" stands for the family's ref_format.
std::string ZooFileName(const FamilySpec& family, std::string_view format);

// A weight format as a zoo names it: one of the llama-quantize types the CPU backend runs (F16,
// BF16, Q8_0, Q6_K, Q4_K_M, IQ2_XS ...), in any case, given back upper case; "ref" as it is.
// InvalidArgument for any other name.
StatusOr<std::string> ParseZooFormat(std::string_view name);

// The complete GGUF metadata for (family, preset), tokenizer keys excluded: general.* keys,
// skippy.* provenance keys and the architecture's hyperparameters. Deterministic.
StatusOr<Metadata> BuildMetadata(const FamilySpec& family, Preset preset);

// Approximate parameter count (weights) for a preset, from the dims; exact counts come from the
// written file. Used by --list.
uint64_t ApproxParameterCount(const FamilySpec& family, const Dims& dims, uint64_t n_vocab);

// Bump when the generator's output changes for the same table (weights init, writer layout).
inline constexpr uint32_t kGeneratorVersion = 2;  // 2: no unread legacy ssm_in beside attn_qkv

}  // namespace skippy::zoo
