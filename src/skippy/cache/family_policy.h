// Family policy: which production payload a model may use, decided from its architecture, its
// tensor names and the memory kind llama.cpp reports -- never from a hand-written switch.
//
// The rules (docs/DESIGN.md, "Payloads and prefix identity"):
//   - A model with recurrent/stateful tensors (a name containing ".ssm", "ssm_", "time_mix",
//     "recurrent" or "rwkv") or whose llama.cpp memory is recurrent or hybrid never gets KV-only
//     reuse: it gets kKvRecurrent or nothing.
//   - An architecture that is not a row of the family table is learned: its payload follows from
//     its memory (recurrent or hybrid: kKvRecurrent, else kResidentKv), and it stays disabled until
//     a certification run on the model itself passes (FamilyDecision::learned; the certifier and
//     skippy-server's startup run one).
//   - A certification row can disable a known family, with a reason.
//   - kFullState and kRecurrentOnly are diagnostics, never production payloads.
//
// Adding a family is adding one row to kFamilyTable in family_policy.cc.
//
// Thread-safety: FamilyPolicy is immutable after construction; all methods are const and may be
// called concurrently.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "skippy/cache/payload_kind.h"
#include "skippy/common/status.h"

namespace skippy::cache {

// How llama.cpp keeps a family's per-sequence memory.
enum class MemoryKind : uint8_t {
  kKv,         // plain attention KV cache ("kv")
  kKvIswa,     // interleaved sliding-window attention KV ("kv-iswa")
  kRecurrent,  // recurrent/SSM state only ("recurrent")
  kHybrid,     // attention KV plus recurrent state ("hybrid")
};
std::string_view MemoryKindName(MemoryKind kind);

// One row of the known-family table, in the evidence order (the README's family table).
struct FamilyRow {
  std::string_view key;           // stable id used in tables and JSON, e.g. "qwen3next"
  std::string_view display_name;  // e.g. "Qwen3Next"
  std::string_view arch;          // llama.cpp general.architecture, e.g. "qwen3next"
  MemoryKind memory;
  PayloadKind payload;            // the one production payload for the family
  bool package_only;              // true for rows reported in the package-only section
};

// The 13 families plus DeepSeek3 (package-only), in evidence order.
std::span<const FamilyRow> KnownFamilies();
// The row with this key, or nullptr.
const FamilyRow* FindFamilyByKey(std::string_view key);
// The first row with this architecture (several families may share one arch: deepseek2, gemma4),
// or nullptr.
const FamilyRow* FindFamilyByArch(std::string_view arch);

// True if a tensor name carries a recurrent/stateful marker.
bool IsRecurrentTensorName(std::string_view tensor_name);

// What the runtime adapter reads from the GGUF and the llama.cpp model.
struct ModelFacts {
  std::string arch;                       // general.architecture
  std::string family_key;                 // optional: picks one row among rows sharing an arch
  std::vector<std::string> tensor_names;  // all tensor names in the GGUF
  bool memory_is_recurrent = false;       // llama_model_is_recurrent
  bool memory_is_hybrid = false;          // llama_model_is_hybrid
};

// A certification verdict that overrides the table for one family.
struct CertificationRow {
  std::string family_key;
  bool enabled = true;
  std::string reason;  // why it is disabled (shown to users); empty when enabled
};

struct FamilyDecision {
  bool enabled = false;
  std::string family_key;       // "" when the arch is unknown
  std::string display_name;
  PayloadKind payload = PayloadKind::kResidentKv;  // meaningful only when enabled
  bool recurrent = false;       // recurrent markers or recurrent/hybrid memory were detected
  // The architecture is not in the family table: family_key and display_name are the architecture,
  // the payload was derived from its memory, and `enabled` turns true only through Certified()
  // after a certification run on this model passes.
  bool learned = false;
  std::string reason;           // why it is disabled; "" when enabled
};

// `learned` with enabled set and the reason cleared: what a passing certification run on the
// model makes of a learned decision. Any other decision is returned unchanged.
FamilyDecision Certified(FamilyDecision learned);

class FamilyPolicy {
 public:
  // certifications: rows that disable (or explicitly keep) families; later rows win.
  explicit FamilyPolicy(std::vector<CertificationRow> certifications = {});

  // Decides the production payload for a model. Never fails: an undecidable model is a disabled
  // decision with a reason.
  FamilyDecision Decide(const ModelFacts& facts) const;

  // Validates a request to record or serve `requested` for a model with `decision`:
  //   FailedPrecondition if the family is disabled, if kv-recurrent is asked of a dense family, if
  //   resident-kv (KV-only reuse) is asked of a recurrent/hybrid family, or if a diagnostic payload
  //   is asked for while `allow_diagnostic` is false. The message names family and payloads.
  [[nodiscard]] Status ValidateRequest(const FamilyDecision& decision, PayloadKind requested,
                                       bool allow_diagnostic = false) const;

 private:
  std::vector<CertificationRow> certifications_;
};

}  // namespace skippy::cache
