#include "skippy/lane_cache/recorder.h"

#include <string>

#include "skippy/common/digest.h"
#include "skippy/common/strings.h"
#include "skippy/lane_cache/warn.h"

namespace skippy::lane_cache {

using cache::PayloadKind;

cache::PrefixScope DecodedScope(const cache::PrefixScope& scope, const cache::BatchClasses& classes) {
  // Length-prefixed, and for every classing: a namespace ends with the client's cache salt, so
  // "ns" + "#short:" + fp would be the plain namespace of a salt that ends the same way.
  cache::PrefixScope s = scope;
  s.cache_namespace = StrCat(scope.cache_namespace.size(), ":", scope.cache_namespace, "#short:", classes.Fingerprint());
  return s;
}

void Recorder::Count(bool recorded) { ++(recorded ? counters_.records : counters_.record_skips); }

bool Recorder::Resident(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prompt,
                        const cache::BatchClasses& classes, bool exact_only) {
  if (backend_.SequenceLength(lane) != static_cast<int32_t>(prompt.size())) {
    Count(false);
    return false;
  }
  auto bytes = backend_.ExportResident(lane);
  if (!bytes.ok()) Warn("export", bytes.status());
  const bool recorded =
      bytes.ok() && Store(scope, prompt, PayloadKind::kResidentKv, *bytes, exact_only, classes).has_value();
  Count(recorded);
  return recorded;
}

bool Recorder::Recurrent(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prefix,
                         const cache::BatchClasses& classes) {
  // The whole state is exported: it is the prefix's only when the lane holds exactly the prefix.
  if (backend_.SequenceLength(lane) != static_cast<int32_t>(prefix.size())) {
    Count(false);
    return false;
  }
  auto bytes = backend_.ExportState(lane, PayloadKind::kKvRecurrent);
  if (!bytes.ok()) {
    Warn("export", bytes.status());
    Count(false);
    return false;
  }
  const bool recorded = Store(scope, prefix, PayloadKind::kKvRecurrent, *bytes, false, classes).has_value();
  Count(recorded);
  return recorded;
}

std::optional<PendingRecord> Recorder::CopyRecurrent(int32_t lane, size_t tokens) {
  auto part = backend_.ExportState(lane, PayloadKind::kRecurrentOnly);
  if (!part.ok()) {
    Warn("recurrent state copy", part.status());
    Count(false);
    return std::nullopt;
  }
  return PendingRecord{tokens, std::move(*part)};
}

void Recorder::Deferred(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prompt,
                        const cache::BatchClasses& classes, bool record_prompt, std::span<const PendingRecord> pending) {
  if (!record_prompt && pending.empty()) return;
  auto full = backend_.ExportState(lane, PayloadKind::kKvRecurrent);
  if (!full.ok()) {
    Warn("export", full.status());
    counters_.record_skips += pending.size() + (record_prompt ? 1 : 0);
    return;
  }
  if (record_prompt) Count(Store(scope, prompt, PayloadKind::kKvRecurrent, *full, false, classes).has_value());
  for (const PendingRecord& p : pending) {
    if (p.tokens == 0 || p.tokens >= prompt.size()) continue;
    auto bytes = backend_.StateAt(*full, p.tokens, p.recurrent);
    if (!bytes.ok()) Warn("deferred record", bytes.status());
    Count(bytes.ok() &&
          Store(scope, prompt.first(p.tokens), PayloadKind::kKvRecurrent, *bytes, false, classes).has_value());
  }
}

void Recorder::Decoded(const cache::PrefixScope& scope, std::span<const Token> prompt,
                       const cache::BatchClasses& classes, const std::vector<float>& logits) {
  if (Status s = cache_.PutDecoded(DecodedScope(scope, classes), prompt, logits); !s.ok()) Warn("decoded result", s);
}

std::optional<std::string> Recorder::TenantNamespace(const cache::PrefixScope& scope) const {
  if (!tenant_of_) return std::nullopt;
  return tenant_of_(scope.cache_namespace);
}

std::optional<std::string> Recorder::TierNamespace(const cache::PrefixScope& scope) const {
  if (tiers_.empty() || !tenant_of_) return std::nullopt;
  return tenant_of_(scope.cache_namespace);
}

std::optional<cache::EntryId> Recorder::Adopt(const cache::PrefixScope& scope, const cache::PrefixRecord& record,
                                              std::span<const uint8_t> bytes, const cache::PrefixTier* from) {
  return Store(scope, record.tokens, record.kind, bytes, record.exact_only, record.classes, from);
}

std::optional<cache::EntryId> Recorder::Store(const cache::PrefixScope& scope, std::span<const Token> tokens,
                                              PayloadKind kind, std::span<const uint8_t> bytes, bool exact_only,
                                              const cache::BatchClasses& classes, const cache::PrefixTier* from) {
  cache::RecordRequest rq;
  rq.kind = kind;
  rq.bytes = bytes.size();
  rq.recompute_cost = static_cast<double>(tokens.size());
  rq.needs_sequence = false;
  rq.exact_only = exact_only;
  auto res = cache_.Reserve(scope, tokens, rq);
  if (!res.ok()) return std::nullopt;  // already recorded, or no room
  for (const cache::EntryInfo& e : res->evictions) {
    Free(e);
    ++counters_.evictions;
  }
  // Bytes are deduplicated within the scope's namespace only (PayloadTier: dedup domains).
  const std::string& ns = scope.cache_namespace;
  const uint64_t domain = Hash64(std::as_bytes(std::span(ns.data(), ns.size())));
  auto put = tier_.Put(std::as_bytes(bytes), [this](cache::PayloadId id) { PayloadEvicted(id); }, domain);
  if (!put.ok()) {
    Warn("payload put", put.status());
    (void)cache_.Abort(res->id);
    return std::nullopt;
  }
  auto id = cache_.Commit(res->id, put->id);
  if (!id.ok()) {
    Warn("commit", id.status());
    (void)cache_.Abort(res->id);  // the reservation's bytes are not counted for good
    (void)tier_.Erase(put->id);
    return std::nullopt;
  }
  EntryTable::Entry entry{scope.cache_namespace, put->id, 0, classes.Prefix(tokens.size())};
  if (kind == PayloadKind::kKvRecurrent && backend_.facts().hybrid_memory) {
    if (auto at = backend_.RecurrentOffset(bytes); at.ok()) entry.recurrent_offset = *at;
  }
  if (std::optional<std::string> tenant = TierNamespace(scope)) {
    for (cache::PrefixTier* t : tiers_) {
      if (t == from) continue;
      cache::PrefixRecord record{*tenant, std::vector<Token>(tokens.begin(), tokens.end()), kind, exact_only,
                                 entry.classes};
      (void)t->Put(std::move(record), std::vector<uint8_t>(bytes.begin(), bytes.end()));
    }
  }
  if (events_) {
    if (std::optional<std::string> tenant = TenantNamespace(scope)) {
      CacheEvent e;
      e.kind = CacheEvent::Kind::kStored;
      e.entry = *id;
      e.tenant_namespace = std::move(*tenant);
      e.tokens.assign(tokens.begin(), tokens.end());
      e.serves_shorter = kind == PayloadKind::kResidentKv && !exact_only;
      events_(std::move(e));
    }
  }
  entries_.Add(*id, std::move(entry));
  return *id;
}

void Recorder::PayloadEvicted(cache::PayloadId payload) {
  const std::optional<cache::EntryId> owner = entries_.PayloadGone(payload);
  if (!owner) return;
  if (auto freed = cache_.Erase(*owner); freed.ok() && freed->has_value()) Free(**freed);
  ++counters_.evictions;
}

void Recorder::Release(cache::EntryId id) {
  if (auto freed = cache_.Release(id); freed.ok() && freed->has_value()) Free(**freed);
}

bool Recorder::Erase(cache::EntryId id) {
  auto freed = cache_.Erase(id);
  if (!freed.ok()) return false;
  if (freed->has_value()) Free(**freed);
  return true;
}

void Recorder::Free(const cache::EntryInfo& info) {
  if (events_) {
    CacheEvent e;
    e.kind = CacheEvent::Kind::kRemoved;
    e.entry = info.id;
    events_(std::move(e));
  }
  const cache::PayloadId payload = entries_.Forget(info.id);
  if (payload != 0) {
    if (Status s = tier_.Erase(payload); !s.ok()) Warn("payload release", s);
  }
}

}  // namespace skippy::lane_cache
