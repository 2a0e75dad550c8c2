// The one-row class decision kept beside a disk tier (--cache-dir) and agreed on a shared tier
// (--shared-redis).
//
// Why: --one-row-class=auto measures a lone decode step at every start (MeasureLoneStep), and on a
// model whose ratio sits within the measure's spread of the tolerance two starts can decide
// differently. A start that decides otherwise answers with other last bits and cannot read the
// entries written under the other decision (their identity holds the class): a restart loses its
// disk tier, and replicas on one shared tier that decided apart share no entries. So:
// - replicas on a shared tier take the decision agreed there (cache::SharedAgreement): the first
//   replica to start measures and proposes it, later ones take it without measuring;
// - a server with a disk tier writes the decision it took there, and later starts with the same key
//   take it (when no shared tier has one) instead of measuring again.
// Both are keyed by everything the measure depends on (ClassDecisionKey).
//
// Disk layout: <dir>/one-row-class/<SHA-256 of the key, 16 hex digits>.json holding {"key", "on",
// "measured"}, written to a temporary file and renamed into place. A file that cannot be read or
// parsed, or whose key differs, is ignored: the server measures and writes it anew. On the shared
// tier the agreement named "one-row-class;" + key holds {"on", "measured"}.
//
// Thread-safety: none needed; the scheduler calls these once, at load, holding the directory's lock
// (cache::CacheDirLock), so a second server refused the directory never reads or writes them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"
#include "skippy/runtime/engine.h"

namespace skippy::server {

// What a decision depends on: `measure` (how it was measured and the tolerance it was held to), the
// model's digest, the llama.cpp build and its patch series, the kernels in force (batch-invariant
// or stock), threads, flash attention, the batch, the lane's capacity (the measure's context is
// clamped to it) and the CPU model (a directory on a shared disk may be read by another machine).
std::string ClassDecisionKey(runtime::Engine& engine, std::string_view measure);

struct ClassDecision {
  bool on = false;
  nlohmann::json measured;  // LoneStepCost::ToJson of the start that measured it
};

// The decision as the disk file and the shared agreement hold it ({"on", "measured"}), and back;
// nullopt for anything else.
nlohmann::json ToJson(const ClassDecision& decision);
std::optional<ClassDecision> ClassDecisionOf(const nlohmann::json& j);

// The decision kept under `dir` for `key`; nullopt when there is none (or it is unreadable, or
// another key's).
std::optional<ClassDecision> LoadClassDecision(const std::string& dir, const std::string& key);
// Writes it; an error leaves any earlier file in place.
[[nodiscard]] Status SaveClassDecision(const std::string& dir, const std::string& key, const ClassDecision& decision);

}  // namespace skippy::server
