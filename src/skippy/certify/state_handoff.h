// The state-handoff certifier: proves, for one model and one payload kind, that a continuation
// after restoring a cached prefix is bit-identical to the continuation computed by the session
// that prefilled it, and measures what a cache hit costs.
//
// Steps (each timed):
//   1. tokenize the prompt, pad it deterministically if short, cut it to prefix + 1 tokens (the
//      benchmark prompt) plus suffix-check tokens after it;
//   2. source: prefill the prefix in lane 0, record the payload (ResidentKv: share the cells into a
//      cache sequence; KvRecurrent/FullState/RecurrentOnly: export the sequence state into the
//      payload store), decode the continuation token, then prefill the suffix-check tokens;
//   3. restore into a cleared lane (lane 1 when there are two lanes), decode the continuation and
//      the suffix the same way, compare logits byte for byte;
//   4. repeat the cache hit N times (restore + decode), comparing each;
//   5. for information, compare with a monolithic (single-batch) prefill of prefix + 1 tokens.
//
// Pass means: same predicted token, byte-identical continuation logits for the first restore and
// every hit, byte-identical suffix logits. The report keeps the reference workflow's key names.
//
// Thread-safety: RunStateHandoff is self-contained; calls may run concurrently on different
// models (each opens its own engine).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "skippy/cache/payload_kind.h"
#include "skippy/common/status.h"
#include "skippy/runtime/model.h"

namespace skippy::certify {

struct StateHandoffOptions {
  std::string model_path;
  std::string model_id;  // default: sha256 prefix of the file
  uint32_t ctx_size = 1024;
  int n_gpu_layers = 0;
  int threads = 2;
  uint32_t batch_size = 512;
  bool flash_attn = true;
  std::string type_k = "f16";
  std::string type_v = "f16";
  std::string prompt;
  std::optional<cache::PayloadKind> payload;  // default: the family's production payload
  int32_t prefix_token_count = 128;
  int32_t suffix_token_count = 16;  // tokens prefilled after the continuation in the suffix check
  int32_t cache_hit_repeats = 5;
  uint32_t lane_count = 2;
  bool borrow_resident_hits = false;
  bool cache_decoded_result_hits = false;
  bool skip_suffix_prefill_check = false;
  // Hits from the disk tier: the exported payload (ResidentKv bytes too) is written to a
  // cache::DiskTier in this directory, the tier is closed and opened again (a restart), and every
  // restore reads the entry back from the file, verified. "" keeps payloads in RAM.
  std::string hits_from_disk_dir;
  // Whole-model stage only; recorded in the report. A partial range is Unimplemented.
  std::optional<int32_t> layer_end, state_layer_start, state_layer_end, state_stage_index;
  std::string stage_load_mode = "full";
};

enum class Verdict {
  kPass,
  kMismatch,
  kDisabled,    // family not certified / payload refused by policy
};

struct StateHandoffResult {
  Verdict verdict = Verdict::kPass;
  nlohmann::json report;  // the JSON report (also on disabled)
};

// Runs the certifier. Errors: InvalidArgument for bad input (empty prompt, prompt longer than the
// context, bad flags), NotFound / DataLoss / InvalidArgument for a bad model file, Unimplemented for
// a partial layer range. Policy refusals are a kDisabled verdict, not an error.
StatusOr<StateHandoffResult> RunStateHandoff(const StateHandoffOptions& options);

// The benchmark prompt construction, shared with the benchmark: the prompt's tokens padded with a
// fixed filler until there are at least `min_tokens`, then cut to exactly `min_tokens`.
// InvalidArgument for an empty prompt.
StatusOr<std::vector<runtime::Token>> BenchmarkTokens(const runtime::Model& model, const std::string& prompt,
                                                      int32_t min_tokens);

}  // namespace skippy::certify
