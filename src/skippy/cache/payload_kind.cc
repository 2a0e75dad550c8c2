#include "skippy/cache/payload_kind.h"

#include <string>

namespace skippy::cache {

std::string_view PayloadKindName(PayloadKind kind) {
  switch (kind) {
    case PayloadKind::kResidentKv: return "resident-kv";
    case PayloadKind::kKvRecurrent: return "kv-recurrent";
    case PayloadKind::kFullState: return "full-state";
    case PayloadKind::kRecurrentOnly: return "recurrent-only";
  }
  return "unknown";
}

StatusOr<PayloadKind> ParsePayloadKind(std::string_view name) {
  for (int i = 0; i < kPayloadKindCount; ++i) {
    auto kind = static_cast<PayloadKind>(i);
    if (PayloadKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      "unknown payload kind '" + std::string(name) +
      "' (expected resident-kv, kv-recurrent, full-state or recurrent-only)");
}

}  // namespace skippy::cache
