#include "skippy/cache/family_policy.h"

#include <array>
#include <string>

namespace skippy::cache {
namespace {

using enum MemoryKind;
constexpr PayloadKind kRk = PayloadKind::kResidentKv;
constexpr PayloadKind kKr = PayloadKind::kKvRecurrent;

// The family table: one row per family, evidence order (the README's family table).
constexpr std::array<FamilyRow, 14> kFamilyTable = {{
    {"qwen3next", "Qwen3Next", "qwen3next", kHybrid, kKr, false},
    {"falcon-h1", "Falcon-H1", "falcon-h1", kHybrid, kKr, false},
    {"llama", "Llama", "llama", kKv, kRk, false},
    {"qwen3", "Qwen3 dense", "qwen3", kKv, kRk, false},
    {"deepseek2", "DeepSeek2", "deepseek2", kKv, kRk, false},
    {"glm47-flash", "GLM-4.7 Flash", "deepseek2", kKv, kRk, false},
    {"glm4", "GLM4", "glm4", kKv, kRk, false},
    {"gemma4-a4b", "Gemma4 A4B", "gemma4", kKvIswa, kRk, false},
    {"gemma4-e4b", "Gemma4 E4B", "gemma4", kKvIswa, kRk, false},
    {"gemma3", "Gemma3", "gemma3", kKvIswa, kRk, false},
    {"gemma2", "Gemma2", "gemma2", kKvIswa, kRk, false},
    {"olmo", "OLMo", "olmo", kKv, kRk, false},
    {"minimax-m27", "MiniMax M2.7", "minimax-m2", kKv, kRk, false},
    {"deepseek3", "DeepSeek3", "deepseek2", kKv, kRk, true},
}};

constexpr std::array<std::string_view, 5> kRecurrentMarkers = {".ssm", "ssm_", "time_mix",
                                                               "recurrent", "rwkv"};

bool IsRecurrentMemory(MemoryKind m) { return m == kRecurrent || m == kHybrid; }

}  // namespace

std::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case kKv: return "kv";
    case kKvIswa: return "kv-iswa";
    case kRecurrent: return "recurrent";
    case kHybrid: return "hybrid";
  }
  return "unknown";
}

std::span<const FamilyRow> KnownFamilies() { return kFamilyTable; }

const FamilyRow* FindFamilyByKey(std::string_view key) {
  for (const FamilyRow& row : kFamilyTable) {
    if (row.key == key) return &row;
  }
  return nullptr;
}

const FamilyRow* FindFamilyByArch(std::string_view arch) {
  for (const FamilyRow& row : kFamilyTable) {
    if (row.arch == arch) return &row;
  }
  return nullptr;
}

bool IsRecurrentTensorName(std::string_view name) {
  for (std::string_view marker : kRecurrentMarkers) {
    if (name.find(marker) != std::string_view::npos) return true;
  }
  return false;
}

FamilyDecision Certified(FamilyDecision learned) {
  if (learned.learned) {
    learned.enabled = true;
    learned.reason.clear();
  }
  return learned;
}

FamilyPolicy::FamilyPolicy(std::vector<CertificationRow> certifications)
    : certifications_(std::move(certifications)) {}

FamilyDecision FamilyPolicy::Decide(const ModelFacts& facts) const {
  FamilyDecision d;
  d.recurrent = facts.memory_is_recurrent || facts.memory_is_hybrid;
  std::string marker_tensor;
  for (const std::string& name : facts.tensor_names) {
    if (IsRecurrentTensorName(name)) {
      d.recurrent = true;
      marker_tensor = name;
      break;
    }
  }
  // The payload the rules demand before the table is consulted.
  d.payload = d.recurrent ? kKr : kRk;

  const FamilyRow* row = nullptr;
  if (!facts.family_key.empty()) {
    row = FindFamilyByKey(facts.family_key);
    if (row == nullptr) {
      d.reason = "unknown family '" + facts.family_key + "' is disabled until certified";
      return d;
    }
    if (row->arch != facts.arch) {
      d.reason = "family '" + facts.family_key + "' expects architecture '" +
                 std::string(row->arch) + "' but the model is '" + facts.arch + "'";
      return d;
    }
  } else {
    row = FindFamilyByArch(facts.arch);
  }
  if (row == nullptr) {
    if (facts.arch.empty()) {
      d.reason = "the model names no architecture: disabled";
      return d;
    }
    d.learned = true;
    d.family_key = facts.arch;
    d.display_name = facts.arch;
    d.reason = "architecture '" + facts.arch + "' is not in the family table: its payload (" +
               std::string(PayloadKindName(d.payload)) + ", from its " +
               (d.recurrent ? "recurrent" : "attention-only") +
               " memory) is disabled until a certification run on this model passes";
    return d;
  }
  d.family_key = std::string(row->key);
  d.display_name = std::string(row->display_name);

  if (d.recurrent && row->payload == kRk) {
    d.reason = "family '" + d.family_key + "' is certified for resident-kv, but the model has " +
               (marker_tensor.empty() ? std::string("recurrent/hybrid memory")
                                      : "recurrent tensor '" + marker_tensor + "'") +
               ": KV-only reuse is never allowed for recurrent state";
    d.payload = kKr;
    return d;
  }
  // The table is the authority when it is stricter (a hybrid row without visible markers).
  d.payload = row->payload;
  d.recurrent = d.recurrent || IsRecurrentMemory(row->memory);

  d.enabled = true;
  for (const CertificationRow& cert : certifications_) {  // later rows win
    if (cert.family_key != d.family_key) continue;
    d.enabled = cert.enabled;
    d.reason = cert.enabled ? "" : (cert.reason.empty() ? "disabled by certification" : cert.reason);
  }
  return d;
}

Status FamilyPolicy::ValidateRequest(const FamilyDecision& decision, PayloadKind requested,
                                     bool allow_diagnostic) const {
  const std::string family = decision.family_key.empty() ? "(unknown)" : decision.family_key;
  const std::string asked(PayloadKindName(requested));
  if (!IsProductionPayload(requested)) {
    if (allow_diagnostic) return absl::OkStatus();
    return absl::FailedPreconditionError(asked + " is a diagnostic payload, never a production mode (family " +
                                         family + ")");
  }
  if (!decision.enabled) {
    return absl::FailedPreconditionError("family " + family + " is disabled: " + decision.reason);
  }
  if (requested == decision.payload) return absl::OkStatus();
  if (requested == kKr) {
    return absl::FailedPreconditionError("kv-recurrent requested for dense family " + family +
                                         ", which has no recurrent state; its payload is " +
                                         std::string(PayloadKindName(decision.payload)));
  }
  return absl::FailedPreconditionError("resident-kv (KV-only reuse) requested for recurrent/hybrid family " +
                                       family + "; its only production payload is kv-recurrent");
}

}  // namespace skippy::cache
