#include "skippy/lane_cache/restore.h"

#include <algorithm>

#include "skippy/cache/payload_kind.h"
#include "skippy/lane_cache/warn.h"

namespace skippy::lane_cache {

using cache::PayloadKind;

// The state of one restore's lookups.
struct Restorer::Attempt {
  size_t limit = 0;   // the longest prefix that leaves a batch of the last run's class to prefill
  size_t branch = 0;  // max(lane tokens, lookup path): see RestoreOutcome::branch
  std::optional<cache::Match> match;  // pinned
  cache::MissReason reason = cache::MissReason::kNeverSeen;
};

RestoreOutcome Restorer::Miss(int32_t lane, std::string reason, size_t branch) {
  (void)backend_.Clear(lane);
  RestoreOutcome out;
  out.miss_reason = std::move(reason);
  out.branch = branch;
  return out;
}

std::optional<Restorer::Promoted> Restorer::PromoteFromTiers(const LaneJob& job, std::span<const Token> key,
                                                              size_t have) {
  const std::vector<cache::PrefixTier*>& tiers = recorder_.tiers();
  if (tiers.empty() || key.size() <= have) return std::nullopt;
  const std::optional<std::string> tenant = recorder_.TierNamespace(job.scope);
  if (!tenant) return std::nullopt;
  if (auto ram = cache_.Peek(job.scope, key); ram.ok() && ram->match) {
    have = std::max(have, ram->match->usable_tokens);
    if (have >= key.size()) return std::nullopt;
  }
  // Worth a read only if it serves more rows, computed in this prompt's classes, than RAM or the
  // lane. Longest first; a stable sort keeps the nearer tier first on a tie.
  struct Candidate {
    cache::PrefixTier* tier;
    cache::TierHit hit;
    size_t serves;
  };
  std::vector<Candidate> found;
  for (cache::PrefixTier* t : tiers) {
    std::optional<cache::TierHit> hit = t->Lookup(*tenant, key);
    if (!hit) continue;
    const size_t serves = std::min(hit->usable_tokens, job.classes.AgreesUpTo(hit->record.classes));
    if (serves > have) found.push_back({t, std::move(*hit), serves});
  }
  std::stable_sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) { return a.serves > b.serves; });
  for (const Candidate& c : found) {
    if (Status s = c.tier->Read(c.hit, tier_buffer_); !s.ok()) {
      // NotFound: evicted since the lookup, an ordinary race (counted by the tier).
      if (!absl::IsNotFound(s)) Warn(c.tier->Name() == "disk" ? "disk read" : "shared read", s);
      continue;
    }
    std::optional<cache::EntryId> id = recorder_.Adopt(job.scope, c.hit.record, tier_buffer_, c.tier);
    if (!id) return std::nullopt;
    ++(c.tier->Name() == "disk" ? counters_.disk_hits : counters_.shared_hits);
    return Promoted{*id, c.tier->Name()};
  }
  return std::nullopt;
}

size_t Restorer::AgreedRows(cache::EntryId id, const cache::BatchClasses& classes) const {
  const EntryTable::Entry* e = entries_.Find(id);
  return e == nullptr ? 0 : classes.AgreesUpTo(e->classes);
}

bool Restorer::FindEntry(FamilyStrategy& strategy, const LaneJob& job, bool decoded, Attempt& a) {
  const std::span<const Token> prompt = job.prompt;
  const cache::BatchClasses& classes = job.classes;
  const size_t n = prompt.size();
  const size_t min_batch = backend_.facts().min_exact_batch;
  auto lookup = [&](std::span<const Token> key) {
    auto lr = cache_.Lookup(job.scope, key);
    if (!lr.ok()) {
      Warn("lookup", lr.status());
      return false;
    }
    a.match = lr->match;
    a.reason = lr->miss_reason;
    // The whole key on a stored path is no branch (the prompt may go on the same way).
    if (lr->path_tokens < key.size()) a.branch = std::max(a.branch, lr->path_tokens);
    return true;
  };
  auto drop = [&] {
    recorder_.Release(a.match->entry.id);
    a.match.reset();
  };
  // An exact repeat takes an entry of the whole prompt, whose rows were all classed as these.
  if (decoded) {
    if (!lookup(prompt)) return false;
    if (a.match && (a.match->usable_tokens != n || AgreedRows(a.match->entry.id, classes) < n)) drop();
  }
  // An entry serves up to its first row classed otherwise, and ends where a batch may start: a
  // stored KV prefix is cut back to such a point, an exact-length entry makes way for a shorter one.
  for (size_t key = a.limit, tries = 0; !a.match && key >= min_batch && tries < 4; ++tries) {
    if (!lookup(prompt.first(key))) return false;
    if (!a.match) break;
    const size_t u = a.match->usable_tokens;
    const size_t agreed = AgreedRows(a.match->entry.id, classes);
    if (agreed >= u && classes.CanStartAt(u)) break;
    const size_t start = classes.LastStartAtOrBelow(std::min(agreed, u));
    if (!strategy.ExactOnly(a.match->entry.tokens) && start >= min_batch) {
      a.match->usable_tokens = start;
      break;
    }
    drop();
    key = start;
  }
  return true;
}

RestoreOutcome Restorer::Restore(FamilyStrategy& strategy, int32_t lane, const LaneJob& job, const LaneHeld& held) {
  if (!strategy.serves()) return Miss(lane, "cache-disabled", 0);
  const std::span<const Token> prompt = job.prompt;
  const cache::BatchClasses& classes = job.classes;
  const size_t n = prompt.size();
  const size_t min_batch = backend_.facts().min_exact_batch;
  if (n < min_batch) return Miss(lane, "short-prompt", 0);
  std::shared_ptr<const cache::DecodedResult> decoded;
  if (auto d = cache_.GetDecoded(DecodedScope(job.scope, classes), prompt); d.ok()) decoded = *d;
  Attempt a;
  // At least one batch of the last run's class is left to prefill (as a recompute computes it),
  // unless the whole prompt is restored for an exact repeat answered from its decoded result.
  a.limit = classes.LastStartAtOrBelow(n - 1);
  // A lane that held a prompt shorter than min_batch computed it in a short batch.
  const size_t lane_shared =
      held.prompt_tokens < min_batch ? 0 : std::min({held.shared_tokens, n, held.prompt_tokens});
  // The lane's last prompt diverges from this one there, unless this one just extends it.
  a.branch = lane_shared < std::min(n, held.prompt_tokens) ? lane_shared : 0;
  // Its rows serve only as far as they were computed in this prompt's classes.
  const size_t lane_agreed = held.classes ? std::min(lane_shared, classes.AgreesUpTo(*held.classes)) : 0;
  size_t keep = 0;
  switch (strategy.lane_keep()) {
    case FamilyStrategy::LaneKeep::kNothing: break;
    case FamilyStrategy::LaneKeep::kPromptKv: keep = lane_agreed; break;
    // A recurrent state cannot be cut back: the lane serves only a prompt that extends all of it.
    case FamilyStrategy::LaneKeep::kEverything:
      if (lane_agreed > 0 && lane_agreed == held.prompt_tokens &&
          backend_.SequenceLength(lane) == static_cast<int32_t>(lane_agreed)) {
        keep = lane_agreed;
      }
      break;
  }
  const size_t whole_lane = keep;
  if (!(decoded && keep == n)) keep = classes.LastStartAtOrBelow(std::min(keep, a.limit));
  if (strategy.lane_keep() == FamilyStrategy::LaneKeep::kEverything && keep != whole_lane) keep = 0;
  const std::optional<Promoted> promoted = PromoteFromTiers(job, decoded ? prompt : prompt.first(a.limit), keep);
  if (!FindEntry(strategy, job, decoded != nullptr, a)) return Miss(lane, "restore-failed", a.branch);
  if (keep > 0) keep = strategy.UsableLaneTokens(lane, keep);
  // The lane already holds at least as much (less the strategy's margin): no entry is needed.
  if (a.match && keep > 0 && keep + strategy.ImportMargin(a.match->usable_tokens) >= a.match->usable_tokens) {
    recorder_.Release(a.match->entry.id);
    a.match.reset();
  }
  RestoreOutcome out;
  out.branch = a.branch;
  if (!a.match) {
    if (keep == 0) return Miss(lane, std::string(cache::MissReasonName(a.reason)), a.branch);
    if (Status t = backend_.Truncate(lane, static_cast<int32_t>(keep)); !t.ok()) {
      Warn("lane reuse", t);
      return Miss(lane, "restore-failed", a.branch);
    }
    ++counters_.lane_hits;
    strategy.AfterLaneCut(lane, job, keep, a.branch);
    out.restored = keep;
    out.payload = std::string(cache::PayloadKindName(PayloadKind::kResidentKv));
    out.tier = "lane";
    if (decoded && keep == n) out.decoded = std::move(decoded);
    return out;
  }
  const cache::Match m = *a.match;
  // The core serves an exact-length entry only whole; a sliding-window entry cut by the class
  // check above is refused here.
  if (strategy.ExactOnly(m.entry.tokens) && m.usable_tokens < m.entry.tokens) {
    recorder_.Release(m.entry.id);
    return Miss(lane, "swa-shorter-prefix", a.branch);
  }
  const Status s = strategy.Import(m, lane, prompt, lane_agreed);
  recorder_.Release(m.entry.id);
  if (!s.ok() || backend_.SequenceLength(lane) != static_cast<int32_t>(m.usable_tokens)) {
    if (!s.ok()) Warn("restore", s);
    return Miss(lane, "restore-failed", a.branch);
  }
  out.restored = m.usable_tokens;
  out.payload = std::string(cache::PayloadKindName(m.entry.desc.kind));
  out.tier = promoted && promoted->id == m.entry.id ? std::string(promoted->tier) : "memory";
  if (decoded && out.restored == n) out.decoded = std::move(decoded);
  return out;
}

Status Restorer::ImportStored(const cache::EntryDesc& desc, int32_t lane, std::span<const Token> tokens) {
  auto bytes = tier_.Get(desc.payload_id);
  if (!bytes.ok()) return bytes.status();
  const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
  return desc.kind == PayloadKind::kResidentKv ? backend_.ImportResident(data, lane, tokens)
                                               : backend_.ImportState(data, lane, desc.kind);
}

Status Restorer::RestoreRecurrentOnto(const cache::EntryInfo& entry, int32_t lane, size_t n_tokens) {
  const EntryTable::Entry* e = entries_.Find(entry.id);
  if (e == nullptr || e->recurrent_offset == 0) {
    return absl::FailedPreconditionError("the entry's recurrent part is not located");
  }
  const size_t at = e->recurrent_offset;
  const size_t header = backend_.facts().state_header_bytes;
  SKIPPY_ASSIGN_OR_RETURN(const size_t size, tier_.Size(entry.desc.payload_id));
  if (at >= size || header > at) return absl::DataLossError("recurrent offset past the payload");
  std::vector<uint8_t> part(header + (size - at));
  auto out = std::as_writable_bytes(std::span(part));
  SKIPPY_RETURN_IF_ERROR(tier_.ReadRange(entry.desc.payload_id, 0, out.first(header)));
  SKIPPY_RETURN_IF_ERROR(tier_.ReadRange(entry.desc.payload_id, at, out.subspan(header)));
  return backend_.RestoreRecurrentOnto(part, lane, static_cast<int32_t>(n_tokens));
}

}  // namespace skippy::lane_cache
