#include "skippy/server/serving_cache.h"

#include "skippy/runtime/sequence_state.h"

#include <limits>

#include <algorithm>
#include <cstdio>

#include "skippy/cache/record_plan.h"
#include "skippy/certify/batch_split.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/sequence_state.h"

#ifndef SKIPPY_LLAMA_COMMIT
#define SKIPPY_LLAMA_COMMIT "unknown"
#endif
#ifndef SKIPPY_LLAMA_PATCHES
#define SKIPPY_LLAMA_PATCHES "none"
#endif

namespace skippy::server {

using cache::PayloadKind;
using runtime::Token;

namespace {

void Warn(const std::string& what, const Status& s) {
  std::fprintf(stderr, "skippy-server: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
}

}  // namespace

StatusOr<std::unique_ptr<ServingCache>> ServingCache::Create(const ServerOptions& o, runtime::Engine& engine) {
  std::unique_ptr<ServingCache> c(new ServingCache(o, engine));
  c->enabled_ = o.cache_enabled;
  if (c->enabled_ && engine.family().enabled) {
    // Restores are exact only if prefill results do not depend on where batches are cut (above
    // runtime::MinExactBatch rows); prove it for this model, build and CPU before serving hits.
    auto check = certify::CheckBatchSplits(engine, 0, engine.MinExactBatch());
    if (!check.ok()) {
      c->enabled_ = false;
      c->disabled_reason_ = StrCat("the batch-split check could not run: ", check.status().message());
    } else {
      c->batch_split_ = check->ToJson();
      if (!check->pass) {
        c->enabled_ = false;
        c->disabled_reason_ = StrCat("the batch-split check failed: logits depend on where prefill batches of ",
                                     check->min_batch, "+ rows are cut");
      }
    }
    if (!c->enabled_) std::fprintf(stderr, "skippy-server: the cache is off: %s\n", c->disabled_reason_.c_str());
  }
  const runtime::Model& model = engine.model();
  const runtime::ContextOptions& eff = engine.context().options();
  cache::CacheConfigIdentity& id = c->config_;
  id.model_id = engine.model_digest();
  id.layer_begin = 0;
  int32_t n_layer = 1;
  if (auto bc = model.MetaString(model.arch() + ".block_count")) n_layer = std::max(1, std::atoi(bc->c_str()));
  id.layer_end = n_layer;
  id.runtime_abi = "skippy-runtime-1";
  // The kernels that computed a payload are part of its identity: the commit, the patch series and
  // whether its batch-invariant products were on.
  id.llama_version = StrCat(SKIPPY_LLAMA_COMMIT, "+patches:", SKIPPY_LLAMA_PATCHES,
                            runtime::BatchInvariant() ? "+batch-invariant" : "");
  id.type_k = eff.type_k;
  id.type_v = eff.type_v;
  id.flash_attn = eff.flash_attn;
  id.v_trans = !eff.flash_attn;
  id.kv_unified = eff.kv_unified;
  id.swa_full = eff.swa_full;
  id.n_ctx = eff.n_ctx;
  // Threads too: the CPU kernels split output columns by thread, and a column's kernel path can
  // depend on where its chunk ends.
  id.position_config = StrCat("n_batch=", eff.n_batch, ";n_ubatch=", eff.n_ubatch, ";chunk=", o.prefill_chunk,
                              ";threads=", eff.n_threads);
  id.n_vocab = model.n_vocab();
  id.token_start = 0;
  SKIPPY_RETURN_IF_ERROR(id.Validate());

  cache::CacheOptions co;
  co.pool.max_entries = std::max<uint32_t>(1, o.cache_entries);
  co.pool.max_bytes = std::max<uint64_t>(1, o.cache_ram_mib) << 20;
  // The token cap guards the KV cells resident entries hold in the context. KvRecurrent payloads
  // live in the payload store and are capped by bytes and entries only.
  co.pool.max_tokens = engine.family().payload == PayloadKind::kKvRecurrent ? std::numeric_limits<uint32_t>::max()
                                                                           : std::max<uint32_t>(1, o.cache_tokens);
  co.pool.lane_count = static_cast<int32_t>(engine.lane_count());
  co.pool.seq_id_begin = engine.cache_seq(0);
  co.pool.seq_id_end = engine.cache_seq(0) + static_cast<int32_t>(engine.cache_seq_count());
  co.decoded.max_entries = std::max<uint32_t>(1, o.decoded_entries);
  co.decoded.max_bytes = std::max<uint64_t>(1, o.decoded_ram_mib) << 20;
  SKIPPY_ASSIGN_OR_RETURN(c->cache_, cache::Cache::Create(co));
  cache::PayloadStoreOptions so;
  // The pool's byte cap decides; the store's cap sits above it (cache/TODO.md).
  so.max_physical_bytes = co.pool.max_bytes * 2 + (uint64_t{64} << 20);
  SKIPPY_ASSIGN_OR_RETURN(c->store_, cache::PayloadStore::Create(so));

  // ResidentKv charge: measured KV bytes per token (state size of 2 tokens minus 1 token).
  if (engine.family().enabled && engine.family().payload == PayloadKind::kResidentKv) {
    const Token t = 0;
    SKIPPY_RETURN_IF_ERROR(engine.Clear(0));
    SKIPPY_RETURN_IF_ERROR(engine.Decode(0, std::span(&t, 1), 0).status());
    const uint64_t s1 = engine.StateBytes(0);
    SKIPPY_RETURN_IF_ERROR(engine.Decode(0, std::span(&t, 1), 1).status());
    const uint64_t s2 = engine.StateBytes(0);
    SKIPPY_RETURN_IF_ERROR(engine.Clear(0));
    c->resident_bytes_per_token_ = s2 > s1 ? s2 - s1 : std::max<uint64_t>(1, s1);
  }
  return c;
}

cache::PrefixScope ServingCache::Scope(const std::string& ns) const {
  cache::PrefixScope scope;
  scope.config = config_;
  auto it = epochs_.find(ns);
  scope.cache_namespace = StrCat(global_epoch_, ".", it == epochs_.end() ? 0 : it->second, "/", ns);
  return scope;
}

PrefillPlan ServingCache::Plan(std::span<const Token> prompt, std::span<const size_t> message_boundaries,
                               const cache::BatchClasses& classes, size_t restored, size_t branch) const {
  PrefillPlan plan;
  const size_t n = prompt.size();
  restored = std::min(restored, n);
  if (restored == n) return plan;
  // Exact-boundary families need their records decided before prefill: recurrent state cannot be
  // cut afterwards, and a sliding-window KV cache keeps only the window behind its last token.
  std::vector<size_t> records;
  if (n >= MinBatch() && engine_.family().enabled &&
      (engine_.family().payload == PayloadKind::kKvRecurrent || ExactBoundaryResident())) {
    cache::PromptShape shape;
    shape.n_tokens = n;
    for (size_t b : message_boundaries) {
      if (b > 0 && b <= n && (shape.message_boundaries.empty() || shape.message_boundaries.back() < b)) {
        shape.message_boundaries.push_back(b);
      }
    }
    cache::RecordPlanOptions ro;
    ro.kind = PayloadKind::kKvRecurrent;  // exact-boundary planning for both (see above)
    ro.stride = options_.record_stride;
    // The tail record leaves one batch of the last run's class (2 rows after a short message, the
    // long class's minimum after a long one).
    if (options_.record_tail != 0 && !classes.runs().empty()) {
      const bool short_end = classes.runs().back().short_rows;
      ro.tail_tokens = std::max<size_t>(options_.record_tail, short_end ? cache::BatchClasses::kMinShortBatch : MinBatch());
    }
    // A branch within the first grid stride (a shared "Document" header) is not worth a record,
    // nor one the restored prefix already reaches.
    if (branch >= std::max<size_t>(MinBatch(), options_.record_stride) && branch >= restored + MinBatch()) {
      ro.branch_point = branch;
    }
    ro.max_records = std::max<uint32_t>(1, options_.max_records);
    // With --kv-unified, sliding-window records each hold a cache sequence: keep two per prompt (the
    // whole prompt and one boundary before it) so a few prompts do not exhaust the sequences.
    if (ExactBoundaryResident() && engine_.cache_seq_count() > 0) {
      ro.max_records = std::min<uint32_t>(ro.max_records, 2);
    }
    ro.restored_tokens = restored;  // candidates it already covers take no record slot
    // A hit that leaves a short suffix extends a prefix the cache already knows: the full-prompt,
    // branch, turn and tail records serve the next request of the same conversation or agent, and
    // grid points inside the suffix would each cost a state export. A long new part (a hit on a
    // shared header, then a new document) gets the grid like a miss.
    if (restored > 0 && n - restored < 4 * static_cast<size_t>(options_.record_stride)) ro.stride = 0;
    // Records where prefill cuts a long suffix anyway cost no extra batch (see the chunking below).
    ro.free_every = PrefillChunk();
    auto rp = cache::PlanRecords(shape, ro);
    if (rp.ok()) {
      records = rp->boundaries;
    } else {
      Warn("record plan", rp.status());
    }
    std::sort(records.begin(), records.end());
  }
  // The batches follow the prompt's classes; a record boundary that would cut one below its class
  // (too close to the restored prefix, another boundary or a run's end) is dropped.
  std::vector<size_t> inner;
  bool whole = false;
  for (size_t b : records) {
    if (b == n) {
      whole = true;
    } else if (b > restored) {
      inner.push_back(b);
    }
  }
  cache::BatchClasses::Cuts cuts = classes.Cut(restored, inner, PrefillChunk());
  plan.chunk_ends = std::move(cuts.batch_ends);
  plan.record_boundaries = std::move(cuts.stops);
  if (whole) plan.record_boundaries.push_back(n);
  return plan;
}

RestoreOutcome ServingCache::Restore(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prompt,
                                     const cache::BatchClasses& classes, size_t lane_tokens, size_t lane_prompt_tokens,
                                     const cache::BatchClasses* lane_classes) {
  RestoreOutcome out;
  size_t branch = 0;  // max(lane tokens, lookup path): see RestoreOutcome::branch
  auto miss = [&](std::string reason) {
    (void)engine_.Clear(lane);
    out = RestoreOutcome{};
    out.miss_reason = std::move(reason);
    out.branch = branch;
    return out;
  };
  if (!enabled_ || !engine_.family().enabled) return miss("cache-disabled");
  const size_t n = prompt.size();
  if (n < MinBatch()) return miss("short-prompt");
  std::shared_ptr<const cache::DecodedResult> decoded;
  if (auto d = cache_->GetDecoded(DecodedScope(scope, classes), prompt); d.ok()) decoded = *d;
  // At least one batch of the last run's class is left to prefill (as a recompute computes it),
  // unless the whole prompt is restored for an exact repeat answered from its decoded result.
  const size_t limit = classes.LastStartAtOrBelow(n - 1);
  // A lane that held a prompt shorter than MinBatch() computed it in a short batch.
  const size_t lane_shared = lane_prompt_tokens < MinBatch() ? 0 : std::min({lane_tokens, n, lane_prompt_tokens});
  // The lane's last prompt diverges from this one there, unless this one just extends it.
  branch = lane_shared < std::min(n, lane_prompt_tokens) ? lane_shared : 0;
  // Its rows serve only as far as they were computed in this prompt's classes.
  const size_t lane_agreed = lane_classes ? std::min(lane_shared, classes.AgreesUpTo(*lane_classes)) : 0;
  size_t keep = LaneReuse() ? lane_agreed : 0;  // cut the lane itself to this many tokens
  if (!(decoded && keep == n)) keep = classes.LastStartAtOrBelow(std::min(keep, limit));
  std::optional<cache::Match> match;
  cache::MissReason reason = cache::MissReason::kNeverSeen;
  auto lookup = [&](std::span<const Token> key) {
    auto lr = cache_->Lookup(scope, key);
    if (!lr.ok()) {
      Warn("lookup", lr.status());
      return false;
    }
    match = lr->match;
    reason = lr->miss_reason;
    // The whole key on a stored path is no branch (the prompt may go on the same way).
    if (lr->path_tokens < key.size()) branch = std::max(branch, lr->path_tokens);
    return true;
  };
  auto drop = [&] {
    ReleasePin(match->entry.id);
    match.reset();
  };
  if (decoded) {
    if (!lookup(prompt)) return miss("restore-failed");
    if (match && (match->usable_tokens != n || AgreedRows(match->entry.id, classes) < n)) drop();
  }
  // An entry serves up to its first row classed otherwise, and ends where a batch may start: a
  // stored KV prefix is cut back to such a point, an exact-boundary entry makes way for a shorter one.
  for (size_t key = limit, tries = 0; !match && key >= MinBatch() && tries < 4; ++tries) {
    if (!lookup(prompt.first(key))) return miss("restore-failed");
    if (!match) break;
    const size_t u = match->usable_tokens;
    const size_t agreed = AgreedRows(match->entry.id, classes);
    if (agreed >= u && classes.CanStartAt(u)) break;
    const size_t start = classes.LastStartAtOrBelow(std::min(agreed, u));
    const bool cuttable = match->entry.desc.kind == PayloadKind::kResidentKv && !SlidingWindowExact(match->entry.tokens);
    if (cuttable && start >= MinBatch()) {
      match->usable_tokens = start;
      break;
    }
    drop();
    key = start;
  }
  if (keep > 0 && engine_.model().n_swa() > 0 && engine_.SequenceFirstPosition(lane) != 0) {
    keep = 0;  // the lane lost early sliding-window cells (never expected with a full-size SWA cache)
  }
  if (keep > 0 && keep < static_cast<size_t>(engine_.PaddedPrefix(lane))) {
    keep = 0;  // cut shorter than a padded sliding-window import, the window would hold padding cells
  }
  // The lane already holds at least as much: no entry is needed. A sliding-window import longer
  // than the window leaves padding cells that stop the lane from later serving shorter prefixes
  // (Engine::PaddedPrefix), so for those the lane also wins unless the entry saves
  // kPaddedImportMinSaving tokens.
  const bool padded_import =
      match && SlidingWindowExact(match->usable_tokens) && match->entry.desc.seq_id == cache::kNoSequence;
  if (match && keep > 0 && keep + (padded_import ? kPaddedImportMinSaving : 0) >= match->usable_tokens) {
    ReleasePin(match->entry.id);
    match.reset();
  }
  if (!match) {
    if (keep == 0) return miss(std::string(cache::MissReasonName(reason)));
    if (Status t = engine_.Truncate(lane, static_cast<int32_t>(keep)); !t.ok()) {
      Warn("lane reuse", t);
      return miss("restore-failed");
    }
    ++lane_hits_;
    // The lane was cut where this prompt leaves its last one. A sliding-window entry that long
    // serves only its exact length and the plan records only past the restored prefix, so record
    // the cut now: the next prompt that leaves at the same point (another question on the same
    // document, once other prompts have taken the lane) restores it. The lane holds exactly
    // these tokens, computed in the batches of a recompute.
    if (keep == branch && SlidingWindowExact(keep) && keep >= options_.record_stride) {
      RecordResident(lane, scope, prompt.first(keep), classes);
    }
    out.branch = branch;
    out.restored = keep;
    out.payload = std::string(cache::PayloadKindName(PayloadKind::kResidentKv));
    if (decoded && keep == n) out.decoded = std::move(decoded);
    return out;
  }
  const cache::Match m = *match;
  Status s;
  bool refused = false;
  if (m.entry.desc.kind == PayloadKind::kResidentKv && SlidingWindowExact(m.entry.tokens) &&
      m.usable_tokens < m.entry.tokens) {
    refused = true;
  } else if (m.entry.desc.kind == PayloadKind::kResidentKv && m.entry.desc.seq_id != cache::kNoSequence) {
    s = engine_.RestoreResident({m.entry.desc.seq_id, static_cast<int32_t>(m.entry.tokens)}, lane,
                                static_cast<int32_t>(m.usable_tokens));
  } else if (m.entry.desc.kind == PayloadKind::kResidentKv) {
    // A stored (or spilled) entry: import its KV into the lane, then cut it to the usable prefix.
    s = ImportStored(m.entry.desc, lane, prompt.first(m.usable_tokens));
    if (s.ok() && m.usable_tokens < m.entry.tokens) s = engine_.Truncate(lane, static_cast<int32_t>(m.usable_tokens));
    if (s.ok()) ++stored_hits_;
  } else if (HybridLaneReuse() && lane_agreed >= m.usable_tokens && m.usable_tokens == m.entry.tokens) {
    // The lane's attention KV already holds the entry's tokens: bring back only the recurrent state.
    s = RestoreRecurrentOnto(m.entry, lane, m.usable_tokens);
    if (s.ok()) {
      ++recurrent_onto_hits_;
    } else {
      Warn("recurrent-only restore (importing the whole state instead)", s);
      s = ImportStored(m.entry.desc, lane, prompt.first(m.usable_tokens));
    }
  } else {
    s = ImportStored(m.entry.desc, lane, prompt.first(m.usable_tokens));
  }
  ReleasePin(m.entry.id);
  if (refused) return miss("swa-shorter-prefix");
  if (!s.ok() || engine_.SequenceLength(lane) != static_cast<int32_t>(m.usable_tokens)) {
    if (!s.ok()) Warn("restore", s);
    return miss("restore-failed");
  }
  out.branch = branch;
  out.restored = m.usable_tokens;
  out.payload = std::string(cache::PayloadKindName(m.entry.desc.kind));
  if (decoded && out.restored == n) out.decoded = std::move(decoded);
  return out;
}

void ServingCache::ReleasePin(cache::EntryId id) {
  if (auto freed = cache_->Release(id); freed.ok() && freed->has_value()) Free(**freed);
}

Status ServingCache::ImportStored(const cache::EntryDesc& desc, int32_t lane, std::span<const Token> tokens) {
  auto bytes = store_->Get(desc.payload_id);
  if (!bytes.ok()) return bytes.status();
  const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
  return desc.kind == PayloadKind::kResidentKv ? engine_.ImportResident(data, lane, tokens)
                                               : engine_.ImportState(data, lane, desc.kind);
}

Status ServingCache::RestoreRecurrentOnto(const cache::EntryInfo& entry, int32_t lane, size_t n_tokens) {
  auto it = entries_.find(entry.id);
  if (it == entries_.end() || it->second.recurrent_offset == 0) {
    return absl::FailedPreconditionError("the entry's recurrent part is not located");
  }
  const size_t at = it->second.recurrent_offset;
  SKIPPY_ASSIGN_OR_RETURN(const size_t size, store_->Size(entry.desc.payload_id));
  if (at >= size) return absl::DataLossError("recurrent offset past the payload");
  std::vector<uint8_t> part(runtime::kStateHeaderBytes + (size - at));
  auto out = std::as_writable_bytes(std::span(part));
  SKIPPY_RETURN_IF_ERROR(store_->ReadRange(entry.desc.payload_id, 0, out.first(runtime::kStateHeaderBytes)));
  SKIPPY_RETURN_IF_ERROR(store_->ReadRange(entry.desc.payload_id, at, out.subspan(runtime::kStateHeaderBytes)));
  return engine_.RestoreRecurrentOnto(part, lane, static_cast<int32_t>(n_tokens));
}

size_t ServingCache::MinBatch() const { return engine_.MinExactBatch(); }

bool ServingCache::HybridLaneReuse() const {
  return enabled_ && engine_.family().enabled && engine_.family().payload == PayloadKind::kKvRecurrent &&
         engine_.facts().memory_is_hybrid && engine_.cache_seq_count() == 0 && engine_.model().n_swa() == 0;
}

size_t ServingCache::PrefillChunk() const {
  return std::max<size_t>(2 * MinBatch(), options_.prefill_chunk);
}

bool ServingCache::LaneReuse() const {
  return enabled_ && engine_.family().enabled && engine_.family().payload == PayloadKind::kResidentKv &&
         engine_.cache_seq_count() == 0 && (engine_.model().n_swa() == 0 || engine_.context().options().swa_full);
}

void ServingCache::Free(const cache::EntryInfo& info, bool release_payload) {
  if (info.desc.seq_id != cache::kNoSequence) (void)engine_.Clear(info.desc.seq_id);
  if (info.desc.payload_id != 0) {
    if (release_payload) {
      const uint64_t id = info.desc.payload_id;
      if (Status s = store_->Release(std::span(&id, 1)); !s.ok()) Warn("payload release", s);
    }
    by_payload_.erase(info.desc.payload_id);
  }
  entries_.erase(info.id);
}

void ServingCache::FreeAll(const std::vector<cache::EntryInfo>& infos, bool spill) {
  for (const auto& e : infos) {
    if (spill && e.desc.kind == PayloadKind::kResidentKv && e.desc.seq_id != cache::kNoSequence) {
      Spill(e);
    } else {
      Free(e);
    }
    ++evictions_;
  }
}

void ServingCache::Spill(const cache::EntryInfo& e) {
  auto it = entries_.find(e.id);
  if (it == entries_.end() || it->second.tokens.empty()) {
    Free(e);
    return;
  }
  Registered reg = std::move(it->second);
  auto bytes = engine_.ExportResident(e.desc.seq_id);
  Free(e);  // the cache sequence is cleared before its id is handed out again
  if (!bytes.ok()) {
    Warn("spill export", bytes.status());
    return;
  }
  if (StorePayload(reg.scope, reg.tokens, PayloadKind::kResidentKv, *bytes, e.desc.recompute_cost, e.desc.exact_only,
                   reg.classes)) {
    ++spills_;
  }
}

bool ServingCache::StorePayload(const cache::PrefixScope& scope, std::span<const Token> tokens, PayloadKind kind,
                                const std::vector<uint8_t>& bytes, double recompute_cost, bool exact_only,
                                const cache::BatchClasses& classes) {
  cache::RecordRequest rq;
  rq.kind = kind;
  rq.bytes = bytes.size();
  rq.recompute_cost = recompute_cost;
  rq.needs_sequence = false;
  rq.exact_only = exact_only;
  auto res = cache_->Reserve(scope, tokens, rq);
  if (!res.ok()) return false;  // already recorded, or no room
  // Making room in host RAM drops entries; it never spills (that would need room itself).
  FreeAll(res->evictions, /*spill=*/false);
  auto put = store_->Put(std::as_bytes(std::span(bytes)));
  if (!put.ok()) {
    Warn("payload put", put.status());
    (void)cache_->Abort(res->id);
    return false;
  }
  DropStoreEvictions(put->evicted);
  auto id = cache_->Commit(res->id, put->id);
  if (!id.ok()) {
    Warn("commit", id.status());
    const uint64_t pid = put->id;
    (void)store_->Release(std::span(&pid, 1));
    return false;
  }
  Registered& reg = entries_[*id];
  reg = {scope.cache_namespace, put->id, {}, {}, 0, classes.Prefix(tokens.size())};
  if (kind == PayloadKind::kKvRecurrent && HybridLaneReuse()) {
    if (auto at = runtime::HybridRecurrentOffset(bytes); at.ok()) reg.recurrent_offset = *at;
  }
  by_payload_[put->id] = *id;
  return true;
}

void ServingCache::DropStoreEvictions(const std::vector<uint64_t>& evicted) {
  for (uint64_t gone : evicted) {
    auto it = by_payload_.find(gone);
    if (it == by_payload_.end()) continue;
    const cache::EntryId eid = it->second;
    by_payload_.erase(it);
    if (auto freed = cache_->Erase(eid); freed.ok() && freed->has_value()) Free(**freed, /*release_payload=*/false);
    ++evictions_;
  }
}

void ServingCache::RecordRecurrent(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prefix,
                                   const cache::BatchClasses& classes) {
  if (!enabled_ || !engine_.family().enabled || engine_.family().payload != PayloadKind::kKvRecurrent) return;
  if (prefix.size() < MinBatch()) return;
  auto bytes = engine_.ExportState(lane, PayloadKind::kKvRecurrent);
  if (!bytes.ok()) {
    Warn("export", bytes.status());
    return;
  }
  if (StorePayload(scope, prefix, PayloadKind::kKvRecurrent, *bytes, static_cast<double>(prefix.size()), false,
                   classes)) {
    ++records_;
  } else {
    ++record_skips_;
  }
}

std::optional<PendingRecord> ServingCache::CopyRecurrentState(int32_t lane, size_t tokens) {
  if (!enabled_ || !DefersRecurrentRecords() || tokens < MinBatch()) return std::nullopt;
  auto part = engine_.ExportState(lane, PayloadKind::kRecurrentOnly);
  if (!part.ok()) {
    Warn("recurrent state copy", part.status());
    ++record_skips_;
    return std::nullopt;
  }
  return PendingRecord{tokens, std::move(*part)};
}

void ServingCache::RecordDeferred(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prompt,
                                  const cache::BatchClasses& classes, bool record_prompt,
                                  std::span<const PendingRecord> pending) {
  if (!enabled_ || !DefersRecurrentRecords() || (!record_prompt && pending.empty())) return;
  auto full = engine_.ExportState(lane, PayloadKind::kKvRecurrent);
  if (!full.ok()) {
    Warn("export", full.status());
    record_skips_ += pending.size() + (record_prompt ? 1 : 0);
    return;
  }
  if (record_prompt && prompt.size() >= MinBatch()) {
    if (StorePayload(scope, prompt, PayloadKind::kKvRecurrent, *full, static_cast<double>(prompt.size()), false,
                     classes)) {
      ++records_;
    } else {
      ++record_skips_;
    }
  }
  for (const PendingRecord& p : pending) {
    if (p.tokens == 0 || p.tokens >= prompt.size()) continue;
    auto bytes = runtime::HybridStateAt(*full, p.tokens, p.recurrent);
    if (bytes.ok() && StorePayload(scope, prompt.first(p.tokens), PayloadKind::kKvRecurrent, *bytes,
                                   static_cast<double>(p.tokens), false, classes)) {
      ++records_;
    } else {
      if (!bytes.ok()) Warn("deferred record", bytes.status());
      ++record_skips_;
    }
  }
}

void ServingCache::RecordResident(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> prompt,
                                  const cache::BatchClasses& classes) {
  if (!enabled_ || !engine_.family().enabled || engine_.family().payload != PayloadKind::kResidentKv) return;
  if (prompt.size() < MinBatch()) return;
  cache::RecordRequest rq;
  rq.kind = PayloadKind::kResidentKv;
  rq.bytes = resident_bytes_per_token_ * prompt.size();
  rq.recompute_cost = static_cast<double>(prompt.size());
  rq.needs_sequence = true;
  rq.exact_only = SlidingWindowExact(prompt.size());
  if (engine_.cache_seq_count() == 0 || prompt.size() > options_.cache_tokens) {
    // No resident tier, or longer than the whole resident cap: straight to the payload store.
    if (engine_.SequenceLength(lane) != static_cast<int32_t>(prompt.size())) {
      ++record_skips_;
      return;
    }
    auto bytes = engine_.ExportResident(lane);
    if (bytes.ok() &&
        StorePayload(scope, prompt, PayloadKind::kResidentKv, *bytes, rq.recompute_cost, rq.exact_only, classes)) {
      ++records_;
    } else {
      ++record_skips_;
    }
    return;
  }
  auto res = cache_->Reserve(scope, prompt, rq);
  if (!res.ok()) {
    ++record_skips_;
    return;
  }
  FreeAll(res->evictions);
  auto rec = engine_.RecordResident(lane, static_cast<int32_t>(prompt.size()), res->seq_id);
  if (!rec.ok()) {
    Warn("record resident", rec.status());
    (void)engine_.Clear(res->seq_id);
    (void)cache_->Abort(res->id);
    return;
  }
  auto id = cache_->Commit(res->id);
  if (!id.ok()) {
    Warn("commit", id.status());
    (void)engine_.Clear(res->seq_id);
    return;
  }
  ++records_;
  // Kept so the entry can be spilled to the payload store when the resident cap evicts it.
  entries_[*id] = {scope.cache_namespace, 0, scope, std::vector<Token>(prompt.begin(), prompt.end()), 0,
                   classes.Prefix(prompt.size())};
}

void ServingCache::PutDecoded(const cache::PrefixScope& scope, std::span<const Token> prompt,
                              const cache::BatchClasses& classes, const std::vector<float>& logits) {
  if (!enabled_ || !engine_.family().enabled || prompt.size() < MinBatch()) return;
  if (Status s = cache_->PutDecoded(DecodedScope(scope, classes), prompt, logits); !s.ok()) Warn("decoded result", s);
}

size_t ServingCache::AgreedRows(cache::EntryId id, const cache::BatchClasses& classes) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : classes.AgreesUpTo(it->second.classes);
}

cache::PrefixScope ServingCache::DecodedScope(const cache::PrefixScope& scope, const cache::BatchClasses& classes) const {
  const std::string fp = classes.Fingerprint();
  if (fp.empty()) return scope;
  cache::PrefixScope s = scope;
  s.cache_namespace = StrCat(scope.cache_namespace, "#short:", fp);
  return s;
}

size_t ServingCache::Clear(const std::optional<std::string>& ns) {
  std::optional<std::string> prefix;
  if (ns) {
    prefix = Scope(*ns).cache_namespace;
    ++epochs_[*ns];
  } else {
    ++global_epoch_;
    epochs_.clear();
  }
  std::vector<cache::EntryId> victims;
  for (const auto& [id, reg] : entries_) {
    if (!prefix || reg.tenant_namespace == *prefix) victims.push_back(id);
  }
  for (cache::EntryId id : victims) {
    auto freed = cache_->Erase(id);
    if (freed.ok() && freed->has_value()) Free(**freed);
  }
  return victims.size();
}

nlohmann::json ServingCache::StatsJson() const {
  const cache::CacheStats s = cache_->Stats();
  const cache::PayloadStats p = store_->Stats();
  return {
      {"enabled", enabled_},
      {"disabled_reason", disabled_reason_},
      {"batch_split", batch_split_},
      {"batch_invariant", runtime::BatchInvariant()},
      {"flash_attn", engine_.context().options().flash_attn},
      {"family", engine_.family().family_key},
      {"payload", std::string(cache::PayloadKindName(engine_.family().payload))},
      {"entries", s.pool.index.entries},
      {"tokens", s.pool.index.tokens},
      {"bytes_logical", s.pool.index.bytes},
      {"resident_bytes_per_token", resident_bytes_per_token_},
      {"hits", s.pool.index.hits},
      {"misses", s.pool.index.misses},
      {"misses_by_reason",
       {{"never-seen", s.pool.index.miss_never_seen},
        {"evicted", s.pool.index.miss_evicted},
        {"identity-mismatch", s.pool.index.miss_identity_mismatch}}},
      {"evictions", evictions_.load()},
      {"records", records_.load()},
      {"record_skips", record_skips_.load()},
      {"spills", spills_.load()},
      {"stored_hits", stored_hits_.load()},
      {"lane_hits", lane_hits_.load()},
      {"recurrent_onto_hits", recurrent_onto_hits_.load()},
      {"resident_tokens", s.pool.resident_tokens},
      {"free_sequences", s.pool.free_sequences},
      {"payload_store",
       {{"payloads", p.payloads}, {"blocks", p.blocks}, {"logical_bytes", p.logical_bytes},
        {"physical_bytes", p.physical_bytes}, {"saved_bytes", p.saved_bytes}}},
      {"decoded_results",
       {{"entries", s.decoded.entries}, {"bytes", s.decoded.bytes}, {"hits", s.decoded.hits},
        {"misses", s.decoded.misses}, {"evictions", s.decoded.evictions}}},
  };
}

void ServingCache::FillGauges(Gauges& g) const {
  const cache::CacheStats s = cache_->Stats();
  const cache::PayloadStats p = store_->Stats();
  g.cache_entries = s.pool.index.entries;
  g.cache_bytes_logical = s.pool.index.bytes;
  // Resident entries share cells with lanes; their charge is the measured KV bytes they hold.
  uint64_t resident = s.pool.index.bytes > p.logical_bytes ? s.pool.index.bytes - p.logical_bytes : 0;
  g.cache_bytes_physical = p.physical_bytes + resident;
  g.decoded_entries = s.decoded.entries;
  g.decoded_bytes = s.decoded.bytes;
  g.cache_evictions = evictions_.load();
}

}  // namespace skippy::server
