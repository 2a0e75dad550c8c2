// Vocabulary shared by every part of the cache core: token ids and production payload kinds.
// Nothing here knows llama.cpp; a token id is a plain int32_t (llama_token has the same width).
#pragma once

#include <cstdint>
#include <string_view>

#include "skippy/common/status.h"

namespace skippy::cache {

using Token = int32_t;

// What a cache entry holds (docs/DESIGN.md, "Payloads and prefix identity").
//   kResidentKv     attention KV kept resident in a cache sequence of the live context. Attention
//                   KV can be truncated, so an entry serves every shorter prefix of its tokens.
//   kKvRecurrent    attention KV plus recurrent/SSM state captured at the recorded boundary. It
//                   serves only that exact boundary (recurrent state cannot be cut shorter).
//   kFullState      the whole exported sequence state: correctness diagnostic only.
//   kRecurrentOnly  recurrent/SSM state only: diagnostic only.
enum class PayloadKind : uint8_t {
  kResidentKv = 0,
  kKvRecurrent = 1,
  kFullState = 2,
  kRecurrentOnly = 3,
};

inline constexpr int kPayloadKindCount = 4;

// "resident-kv", "kv-recurrent", "full-state", "recurrent-only".
std::string_view PayloadKindName(PayloadKind kind);
// Inverse of PayloadKindName. InvalidArgument for any other string.
[[nodiscard]] StatusOr<PayloadKind> ParsePayloadKind(std::string_view name);

// True only for kResidentKv: the one kind whose entries serve shorter prefixes of their tokens.
// Every other kind serves exactly the boundary where it was recorded.
constexpr bool ServesShorterPrefixes(PayloadKind kind) { return kind == PayloadKind::kResidentKv; }

// True for the kinds that may be served in production (kResidentKv, kKvRecurrent).
constexpr bool IsProductionPayload(PayloadKind kind) {
  return kind == PayloadKind::kResidentKv || kind == PayloadKind::kKvRecurrent;
}

}  // namespace skippy::cache
