#include "skippy/lane_cache/lane_cache.h"

#include <algorithm>
#include <limits>

#include "skippy/cache/payload_store.h"
#include "skippy/common/strings.h"
#include "skippy/lane_cache/warn.h"

namespace skippy::lane_cache {

StatusOr<std::unique_ptr<LaneCache>> LaneCache::Create(const LaneCacheOptions& o, LaneBackend& backend) {
  cache::PayloadStoreOptions so;
  // The pool's byte cap decides; the memory tier's cap sits above it (cache/TODO.md).
  so.max_physical_bytes = std::max<uint64_t>(1, o.max_bytes) * 2 + (uint64_t{64} << 20);
  SKIPPY_ASSIGN_OR_RETURN(std::unique_ptr<cache::PayloadStore> store, cache::PayloadStore::Create(so));
  return Create(o, backend, std::move(store));
}

StatusOr<std::unique_ptr<LaneCache>> LaneCache::Create(const LaneCacheOptions& o, LaneBackend& backend,
                                                       std::unique_ptr<cache::PayloadTier> tier) {
  const BackendFacts& facts = backend.facts();
  SKIPPY_RETURN_IF_ERROR(facts.identity.Validate());
  if (facts.lane_count == 0) return absl::InvalidArgumentError("lane cache: the backend has no lanes");
  if (tier == nullptr) return absl::InvalidArgumentError("lane cache: no payload tier");
  cache::CacheOptions co;
  co.pool.max_entries = std::max<uint32_t>(1, o.max_entries);
  co.pool.max_bytes = std::max<uint64_t>(1, o.max_bytes);
  // Payloads live in the tier, not in context cells: the pool caps entries and bytes only.
  co.pool.max_tokens = std::numeric_limits<uint32_t>::max();
  co.pool.lane_count = static_cast<int32_t>(facts.lane_count);
  co.pool.seq_id_begin = static_cast<int32_t>(facts.lane_count);
  co.pool.seq_id_end = static_cast<int32_t>(facts.lane_count);
  co.decoded.max_entries = std::max<uint32_t>(1, o.decoded_entries);
  co.decoded.max_bytes = std::max<uint64_t>(1, o.decoded_bytes);
  SKIPPY_ASSIGN_OR_RETURN(std::unique_ptr<cache::Cache> core, cache::Cache::Create(co));
  std::unique_ptr<cache::DiskTier> disk;
  if (o.enabled && !o.disk_dir.empty()) {
    cache::DiskTierOptions d;
    d.dir = o.disk_dir;
    d.max_bytes = o.disk_bytes;
    d.min_free_bytes = o.disk_min_free_bytes;
    SKIPPY_ASSIGN_OR_RETURN(disk, cache::DiskTier::Open(d, facts.identity, o.disk_lock));
  }
  std::unique_ptr<cache::SharedTier> shared;
  if (o.enabled && o.shared) {
    SKIPPY_ASSIGN_OR_RETURN(shared, cache::SharedTier::Open(*o.shared, facts.identity));
  }
  return std::unique_ptr<LaneCache>(
      new LaneCache(o, backend, std::move(core), std::move(tier), std::move(disk), std::move(shared)));
}

std::vector<cache::PrefixTier*> LaneCache::Tiers() const {
  std::vector<cache::PrefixTier*> out;
  if (disk_) out.push_back(disk_.get());
  if (shared_) out.push_back(shared_.get());
  return out;
}

LaneCache::LaneCache(const LaneCacheOptions& o, LaneBackend& backend, std::unique_ptr<cache::Cache> core,
                     std::unique_ptr<cache::PayloadTier> tier, std::unique_ptr<cache::DiskTier> disk,
                     std::unique_ptr<cache::SharedTier> shared)
    : options_(o),
      backend_(backend),
      cache_(std::move(core)),
      tier_(std::move(tier)),
      disk_(std::move(disk)),
      shared_(std::move(shared)),
      recorder_(backend, *cache_, *tier_, entries_, counters_, Tiers(),
                [this](const std::string& cache_namespace) { return TenantOf(cache_namespace); }),
      restorer_(backend, *cache_, *tier_, entries_, recorder_, counters_),
      jobs_(backend.facts().lane_count),
      held_(backend.facts().lane_count),
      finished_at_(backend.facts().lane_count, 0) {
  strategy_ = FamilyStrategy::For(backend.facts(), o.enabled,
                                  {backend, recorder_, restorer_, counters_, o.record_stride});
  policy_.exact_boundaries = strategy_->plans_boundaries();
  policy_.min_batch = MinBatch();
  policy_.prefill_chunk = PrefillChunk();
  policy_.stride = o.record_stride;
  policy_.max_records = o.max_records;
  policy_.tail = o.record_tail;
  policy_.cut_cost_rows = o.cut_cost_rows;
  policy_.grid_budget = o.grid_budget;
}

size_t LaneCache::PrefillChunk() const { return std::max<size_t>(2 * MinBatch(), options_.prefill_chunk); }

cache::PrefixScope LaneCache::Scope(const std::string& ns) const {
  cache::PrefixScope scope;
  scope.config = backend_.facts().identity;
  auto it = epochs_.find(ns);
  scope.cache_namespace = StrCat(global_epoch_, ".", it == epochs_.end() ? 0 : it->second, "/", ns);
  return scope;
}

std::optional<std::string> LaneCache::TenantOf(const std::string& cache_namespace) const {
  const size_t slash = cache_namespace.find('/');
  if (slash == std::string::npos) return std::nullopt;
  std::string tenant = cache_namespace.substr(slash + 1);
  if (Scope(tenant).cache_namespace != cache_namespace) return std::nullopt;
  return tenant;
}

LaneHeld LaneCache::Match(const Held& held, const LaneJob& job) const {
  LaneHeld h;
  h.classes = &held.classes;
  if (strategy_->lane_keep() == FamilyStrategy::LaneKeep::kNothing) return h;
  if (held.cache_namespace != job.scope.cache_namespace) return h;
  const size_t limit = std::min(held.tokens.size(), job.prompt.size());
  while (h.shared_tokens < limit && held.tokens[h.shared_tokens] == job.prompt[h.shared_tokens]) ++h.shared_tokens;
  h.prompt_tokens = held.tokens.size();
  return h;
}

JobStart LaneCache::Begin(int32_t lane, const std::string& tenant_namespace, std::span<const Token> prompt,
                          std::span<const size_t> message_ends) {
  LaneJob& job = jobs_.at(static_cast<size_t>(lane));
  job = LaneJob{};
  job.active = true;
  job.scope = Scope(tenant_namespace);
  job.prompt.assign(prompt.begin(), prompt.end());
  job.classes = cache::BatchClasses::Of(prompt.size(), message_ends, MinBatch());
  job.records = strategy_->serves() && prompt.size() >= MinBatch();
  // Exchanges Finish left unrecorded, before any lane changes.
  RecordExchanges();
  // The lane changes from here on: what it held is read once, then forgotten. An answer still to
  // prefill there is this prompt's to compute where it continues the exchange (the rows done are
  // part of what the lane held), else it waits for idle time in the deferred queue.
  Held held = std::move(held_[static_cast<size_t>(lane)]);
  held_[static_cast<size_t>(lane)] = Held{};
  const RestoreOutcome r = restorer_.Restore(*strategy_, lane, job, Match(held, job));
  if (Pending(held) && !Continues(job, held)) Defer(std::move(held), lane);
  counters_.answers_pending = PendingAnswers();
  job.plan = PlanPrefill(policy_, prompt.size(), message_ends, job.classes, r.restored, r.branch);
  job.prompt_end_pending = job.records && r.decoded == nullptr;
  JobStart start;
  start.restored = r.restored;
  start.decoded = r.decoded;
  start.miss_reason = r.miss_reason;
  start.payload = r.payload;
  start.tier = r.tier;
  start.chunk_ends = job.plan.chunk_ends;
  return start;
}

void LaneCache::AtBoundary(int32_t lane, size_t end) {
  LaneJob& job = jobs_.at(static_cast<size_t>(lane));
  if (!job.records || end < MinBatch() || end >= job.prompt.size()) return;
  const std::vector<size_t>& rb = job.plan.record_boundaries;
  if (!std::binary_search(rb.begin(), rb.end(), end)) return;
  strategy_->AtBoundary(lane, job, end);
}

std::optional<PrefillPlan> LaneCache::PlanRecordAlso(const LaneJob& job, size_t tokens, size_t pos) const {
  const size_t n = job.prompt.size();
  if (!job.active || !job.records || !strategy_->plans_boundaries() || tokens <= pos || tokens >= n ||
      tokens < MinBatch()) {
    return std::nullopt;
  }
  const std::vector<size_t>& rb = job.plan.record_boundaries;
  if (std::binary_search(rb.begin(), rb.end(), tokens)) return std::nullopt;
  // pos is the restored prefix or a batch end of the plan, where the rest may be cut again.
  if (pos != 0 && !job.classes.CanStartAt(pos)) return std::nullopt;
  std::vector<size_t> planned;
  for (size_t b : rb) {
    if (b > pos && b < n) planned.push_back(b);
  }
  std::vector<size_t> stops = planned;
  stops.insert(std::upper_bound(stops.begin(), stops.end(), tokens), tokens);
  cache::BatchClasses::Cuts cuts = job.classes.Cut(pos, stops, policy_.prefill_chunk);
  // The new record must not cost one already planned (a branch, turn, tail or grid point less
  // than a smallest batch away from it).
  auto kept = [&](size_t b) { return std::binary_search(cuts.stops.begin(), cuts.stops.end(), b); };
  if (!kept(tokens) || !std::all_of(planned.begin(), planned.end(), kept)) return std::nullopt;
  PrefillPlan plan;
  for (size_t e : job.plan.chunk_ends) {
    if (e <= pos) plan.chunk_ends.push_back(e);
  }
  plan.chunk_ends.insert(plan.chunk_ends.end(), cuts.batch_ends.begin(), cuts.batch_ends.end());
  for (size_t b : rb) {
    if (b <= pos) plan.record_boundaries.push_back(b);
  }
  plan.record_boundaries.insert(plan.record_boundaries.end(), cuts.stops.begin(), cuts.stops.end());
  if (!rb.empty() && rb.back() == n) plan.record_boundaries.push_back(n);
  return plan;
}

LaneCache::SharedRecords LaneCache::RecordsWithin(int32_t lane, size_t tokens, size_t pos) const {
  const LaneJob& job = jobs_.at(static_cast<size_t>(lane));
  SharedRecords r;
  const size_t n = job.prompt.size();
  if (!job.active || !job.records) return r;
  tokens = std::min(tokens, n);
  // Dense: the prompt end's entry serves every prefix of it.
  if (!strategy_->plans_boundaries()) {
    r.later = tokens;
    return r;
  }
  // Exact-boundary families: the deepest record at or below `tokens`. A hybrid's boundaries passed
  // so far become entries only at the prompt end (LaneJob::pending); the others' exist already.
  const std::optional<PrefillPlan> also = PlanRecordAlso(job, tokens, pos);
  const std::vector<size_t>& rb = also ? also->record_boundaries : job.plan.record_boundaries;
  for (size_t b : rb) {
    if (b > tokens) break;
    r.later = b;
    const bool pending = std::any_of(job.pending.begin(), job.pending.end(),
                                     [b](const PendingRecord& p) { return p.tokens == b; });
    if (b <= pos && !pending) r.now = b;
  }
  return r;
}

std::optional<std::vector<size_t>> LaneCache::RecordAlso(int32_t lane, size_t tokens, size_t pos) {
  LaneJob& job = jobs_.at(static_cast<size_t>(lane));
  std::optional<PrefillPlan> plan = PlanRecordAlso(job, tokens, pos);
  if (!plan) return std::nullopt;
  job.plan = *std::move(plan);
  return job.plan.chunk_ends;
}

std::optional<std::vector<size_t>> LaneCache::CutBatch(int32_t lane, size_t pos, size_t rows) {
  LaneJob& job = jobs_.at(static_cast<size_t>(lane));
  std::vector<size_t>& ends = job.plan.chunk_ends;
  const auto next = std::upper_bound(ends.begin(), ends.end(), pos);
  if (!job.active || next == ends.end() || *next - pos <= rows) return std::nullopt;
  const auto& runs = job.classes.runs();
  const auto run = std::find_if(runs.begin(), runs.end(), [pos](const cache::BatchClasses::Run& r) { return pos < r.end; });
  if (run == runs.end() || *next > run->end) return std::nullopt;  // a planned batch never crosses a run
  const size_t min_rows = run->short_rows ? cache::BatchClasses::kMinShortBatch : job.classes.min_long();
  const size_t batch = *next - pos;
  if (batch < 2 * min_rows) return std::nullopt;
  const size_t at = pos + std::clamp(rows, min_rows, batch - min_rows);
  ends.insert(next, at);
  return ends;
}

void LaneCache::AfterFirstToken(int32_t lane, const std::vector<float>& logits) {
  LaneJob& job = jobs_.at(static_cast<size_t>(lane));
  if (!job.prompt_end_pending) return;
  job.prompt_end_pending = false;
  const std::vector<size_t>& rb = job.plan.record_boundaries;
  strategy_->AtPromptEnd(lane, job, std::binary_search(rb.begin(), rb.end(), job.prompt.size()));
  recorder_.Decoded(job.scope, job.prompt, job.classes, logits);
}

void LaneCache::Finish(int32_t lane, bool completed, std::span<const Token> generated, NextTurnFn next_turn) {
  LaneJob& job = jobs_.at(static_cast<size_t>(lane));
  // A job that never began (cancelled while it waited) left the lane as it was.
  if (!job.active) return;
  Held& held = held_[static_cast<size_t>(lane)];
  held = Held{};
  const auto n = static_cast<int32_t>(job.prompt.size());
  bool keep = false;
  bool record_later = false;
  if (completed && n > 0 && strategy_->lane_keep() != FamilyStrategy::LaneKeep::kNothing) {
    // Generated tokens were decoded one row at a time: they join the lane's prompt where a one-row
    // batch is in the prompt rows' class. A conversation's next turn starts with this exchange; as
    // an entry it is restored on whichever lane the turn lands on (the lane itself keeps it only
    // until another job takes it), as llama-server's prompt cache keeps a slot's prompt and answer.
    const bool with_answer = MinBatch() == 1 && !generated.empty() &&
                             backend_.SequenceLength(lane) == n + static_cast<int32_t>(generated.size());
    if (with_answer) {
      job.prompt.insert(job.prompt.end(), generated.begin(), generated.end());
      job.classes = cache::BatchClasses::Of(job.prompt.size(), {}, MinBatch());
    }
    const bool dense = strategy_->lane_keep() == FamilyStrategy::LaneKeep::kPromptKv;
    // With idle work, after the job's response (RecordExchanges), or before the lane next changes.
    record_later = with_answer && job.records && options_.answer_prefill;
    if (with_answer && job.records && !record_later) RecordExchangeEntry(lane, job.scope, job.prompt, job.classes);
    // Otherwise, where every batch of 2+ rows is one class, the answer is prefilled again as
    // prompt rows between jobs (IdleStep).
    const bool answer_later = !with_answer && options_.answer_prefill && job.records &&
                              MinBatch() == cache::BatchClasses::kMinShortBatch && generated.size() >= MinBatch() &&
                              backend_.SequenceLength(lane) == n + static_cast<int32_t>(generated.size());
    if (with_answer) {
      keep = true;
    } else if (dense) {
      // The answer is cut off.
      keep = backend_.Truncate(lane, n).ok() && backend_.SequenceLength(lane) == n;
    } else {
      // kEverything: a recurrent state cannot be cut back, so the lane holds the prompt and the
      // answer while only the prompt is held; it serves only a prompt that extends all it holds.
      keep = backend_.SequenceLength(lane) >= n;
    }
    if (keep && with_answer && options_.answer_prefill && job.records && next_turn) {
      // Whether the next turn holds the answer as decoded is asked in idle time (PrefillAnswer).
      held.answer_from = static_cast<size_t>(n);
      held.answer_at = finishes_ + 1;  // this Finish's
      held.answer_kept = true;
      held.next_turn = std::move(next_turn);
    }
    if (keep && answer_later) {
      held.answer.assign(generated.begin(), generated.end());
      held.answer_from = static_cast<size_t>(n);
      held.answer_at = finishes_ + 1;  // this Finish's
      held.answer_decoded = !dense;
      held.next_turn = std::move(next_turn);
    }
  }
  if (keep) {
    held.tokens = std::move(job.prompt);
    held.cache_namespace = job.scope.cache_namespace;
    held.classes = std::move(job.classes);
    held.exchange_unrecorded = record_later;
  } else {
    (void)backend_.Clear(lane);
  }
  LaneEvent(lane, job.scope.cache_namespace, keep ? held.tokens : std::vector<Token>{});
  finished_at_[static_cast<size_t>(lane)] = ++finishes_;
  job = LaneJob{};
  counters_.answers_pending = PendingAnswers();
}

void LaneCache::LaneEvent(int32_t lane, const std::string& cache_namespace, std::span<const Token> tokens) {
  if (!events_) return;
  std::optional<std::string> tenant = TenantOf(cache_namespace);
  if (!tenant) return;
  CacheEvent e;
  e.kind = CacheEvent::Kind::kLane;
  e.lane = lane;
  e.tenant_namespace = std::move(*tenant);
  if (strategy_->serves()) e.tokens.assign(tokens.begin(), tokens.end());
  events_(std::move(e));
}

bool LaneCache::Continues(const LaneJob& job, const Held& held) {
  if (job.scope.cache_namespace != held.cache_namespace) return false;
  if (held.next_turn) {
    const size_t n = held.answer_kept ? held.answer_from : held.tokens.size();
    return job.prompt.size() > n && std::equal(held.tokens.begin(), held.tokens.begin() + static_cast<ptrdiff_t>(n),
                                               job.prompt.begin());
  }
  const size_t n = held.tokens.size() + held.answer.size();
  return job.prompt.size() > n && std::equal(held.tokens.begin(), held.tokens.end(), job.prompt.begin()) &&
         std::equal(held.answer.begin(), held.answer.end(), job.prompt.begin() + static_cast<ptrdiff_t>(held.tokens.size()));
}

void LaneCache::Defer(Held&& held, int32_t lane) {
  DeferredAnswer d;
  d.cache_namespace = std::move(held.cache_namespace);
  const auto from = static_cast<ptrdiff_t>(held.answer_from);
  d.prompt.assign(held.tokens.begin(), held.tokens.begin() + from);
  d.answer.assign(held.tokens.begin() + from, held.tokens.end());
  d.answer.insert(d.answer.end(), held.answer.begin(), held.answer.end());
  d.lane = lane;
  d.at = held.answer_at;
  d.next_turn = std::move(held.next_turn);
  d.kept = held.answer_kept;
  deferred_.push_back(std::move(d));
  // The newest answers are the likeliest to be continued.
  while (deferred_.size() > kMaxDeferredPerLane * held_.size()) {
    deferred_.erase(OldestDeferred());
    ++counters_.answers_dropped;
  }
}

bool LaneCache::Predict(std::span<const Token> prompt, std::vector<Token>& answer, NextTurnFn& next_turn) const {
  if (!next_turn) return true;
  const std::optional<std::vector<Token>> next = next_turn();
  next_turn = nullptr;
  if (!next) return true;
  const size_t n = prompt.size();
  if (next->size() < n + MinBatch() || !std::equal(prompt.begin(), prompt.end(), next->begin())) return false;
  answer.assign(next->begin() + static_cast<ptrdiff_t>(n), next->end());
  return true;
}

std::deque<LaneCache::DeferredAnswer>::iterator LaneCache::OldestDeferred() {
  return std::min_element(deferred_.begin(), deferred_.end(),
                          [](const DeferredAnswer& a, const DeferredAnswer& b) { return a.at < b.at; });
}

bool LaneCache::HasIdleWork() const { return PendingAnswers() > 0; }

size_t LaneCache::PendingAnswers() const {
  return deferred_.size() + static_cast<size_t>(std::count_if(held_.begin(), held_.end(), [](const Held& h) {
           return Pending(h) || h.exchange_unrecorded;
         }));
}

void LaneCache::RecordExchanges() {
  for (size_t i = 0; i < held_.size(); ++i) RecordExchange(static_cast<int32_t>(i));
  counters_.answers_pending = PendingAnswers();
}

void LaneCache::RecordExchange(int32_t lane) {
  Held& held = held_[static_cast<size_t>(lane)];
  if (!held.exchange_unrecorded) return;
  held.exchange_unrecorded = false;
  if (!TenantOf(held.cache_namespace)) return;  // a Clear since: its records would be unreachable
  RecordExchangeEntry(lane, {backend_.facts().identity, held.cache_namespace}, held.tokens, held.classes);
}

void LaneCache::RecordExchangeEntry(int32_t lane, const cache::PrefixScope& scope, std::span<const Token> tokens,
                                    const cache::BatchClasses& classes) {
  const bool recorded = strategy_->lane_keep() == FamilyStrategy::LaneKeep::kPromptKv
                            ? recorder_.Resident(lane, scope, tokens, classes, strategy_->ExactOnly(tokens.size()))
                            : recorder_.Recurrent(lane, scope, tokens, classes);
  if (recorded) ++counters_.answer_records;
}

void LaneCache::IdleStep(size_t max_rows) {
  IdleWork(max_rows);
  counters_.answers_pending = PendingAnswers();
}

void LaneCache::IdleWork(size_t max_rows) {
  if (std::any_of(jobs_.begin(), jobs_.end(), [](const LaneJob& j) { return j.active; })) return;
  max_rows = std::clamp(max_rows, 2 * MinBatch(), PrefillChunk());
  // An exchange Finish left unrecorded first: one export, before anything changes a lane
  // (PrefillAnswer and Resume, below, run only once none is left).
  for (size_t i = 0; i < held_.size(); ++i) {
    if (held_[i].exchange_unrecorded) return RecordExchange(static_cast<int32_t>(i));
  }
  // The oldest answer first: its conversation is the likeliest to come back next.
  int32_t lane = -1;
  for (size_t i = 0; i < held_.size(); ++i) {
    if (Pending(held_[i]) && (lane < 0 || held_[i].answer_at < held_[static_cast<size_t>(lane)].answer_at)) {
      lane = static_cast<int32_t>(i);
    }
  }
  auto oldest = OldestDeferred();
  if (oldest == deferred_.end() || (lane >= 0 && held_[static_cast<size_t>(lane)].answer_at < oldest->at)) {
    if (lane >= 0) PrefillAnswer(lane, max_rows);
    return;
  }
  DeferredAnswer d = std::move(*oldest);
  deferred_.erase(oldest);
  if (Status s = Resume(d); !s.ok()) {
    ++counters_.answers_dropped;
    if (!absl::IsNotFound(s)) Warn("answer prefill: prompt restore", s);
  }
}

Status LaneCache::Resume(DeferredAnswer& d) {
  if (!TenantOf(d.cache_namespace)) return absl::NotFoundError("the namespace was cleared");
  // The lane idle longest with no answer of its own to prefill (what it holds is its last prompt,
  // whose own entry serves it again), else the lane idle longest, whose answer then waits here.
  int32_t lane = -1;
  for (int pass = 0; pass < 2 && lane < 0; ++pass) {
    for (size_t i = 0; i < held_.size(); ++i) {
      if (pass == 0 && Pending(held_[i])) continue;
      if (lane < 0 || finished_at_[i] < finished_at_[static_cast<size_t>(lane)]) lane = static_cast<int32_t>(i);
    }
  }
  const std::vector<Token> generated = d.kept ? d.answer : std::vector<Token>{};
  if (!Predict(d.prompt, d.answer, d.next_turn)) return absl::NotFoundError("the next turn does not continue the prompt");
  const size_t n = d.prompt.size();
  // A kept answer's exchange, recorded after its job finished, serves what the next turn holds as
  // generated: a dense entry any prefix of it, a hybrid one all of it only.
  size_t from_exchange = d.kept ? KeptServes(generated, d.answer) : 0;
  if (d.kept && from_exchange == d.answer.size()) return absl::OkStatus();
  std::vector<Token> start = d.prompt;
  start.insert(start.end(), d.answer.begin(), d.answer.begin() + static_cast<ptrdiff_t>(from_exchange));
  cache::BatchClasses classes = cache::BatchClasses::Of(start.size(), {}, MinBatch());
  StatusOr<cache::Match> m = EntryOf(d.cache_namespace, start, classes);
  if (!m.ok() && absl::IsNotFound(m.status()) && from_exchange > 0) {
    // The exchange's entry is gone: from the prompt's.
    from_exchange = 0;
    start.resize(n);
    classes = cache::BatchClasses::Of(n, {}, MinBatch());
    m = EntryOf(d.cache_namespace, start, classes);
  }
  SKIPPY_RETURN_IF_ERROR(m.status());
  if (Pending(held_[static_cast<size_t>(lane)])) Defer(std::move(held_[static_cast<size_t>(lane)]), lane);
  held_[static_cast<size_t>(lane)] = Held{};
  const auto restored = static_cast<int32_t>(start.size());
  Status s = restorer_.ImportStored(m->entry.desc, lane, start);
  if (s.ok() && m->entry.tokens > start.size()) s = backend_.Truncate(lane, restored);
  if (s.ok() && backend_.SequenceLength(lane) != restored) s = absl::InternalError("the lane holds another length");
  if (!s.ok()) {
    (void)backend_.Clear(lane);
    return s;
  }
  Held& held = held_[static_cast<size_t>(lane)];
  held.tokens = std::move(start);
  held.cache_namespace = std::move(d.cache_namespace);
  held.classes = std::move(classes);
  held.answer.assign(d.answer.begin() + static_cast<ptrdiff_t>(from_exchange), d.answer.end());
  held.answer_from = n;
  held.answer_at = d.at;
  finished_at_[static_cast<size_t>(lane)] = ++finishes_;  // the next deferred answer takes another lane
  return absl::OkStatus();
}

StatusOr<cache::Match> LaneCache::EntryOf(const std::string& cache_namespace, std::span<const Token> tokens,
                                          const cache::BatchClasses& classes) const {
  const cache::PrefixScope scope{backend_.facts().identity, cache_namespace};
  SKIPPY_ASSIGN_OR_RETURN(cache::LookupResult r, cache_->Peek(scope, tokens));
  const size_t n = tokens.size();
  if (!r.match || r.match->usable_tokens != n || (strategy_->ExactOnly(r.match->entry.tokens) && r.match->entry.tokens != n)) {
    return absl::NotFoundError("no entry of the prompt");
  }
  const EntryTable::Entry* e = entries_.Find(r.match->entry.id);
  if (e == nullptr || classes.AgreesUpTo(e->classes) < n) {
    return absl::NotFoundError("the prompt's entry was computed in other batch classes");
  }
  return *r.match;
}

size_t LaneCache::KeptServes(std::span<const Token> kept, std::span<const Token> next) const {
  const auto common = static_cast<size_t>(std::mismatch(kept.begin(), kept.end(), next.begin(), next.end()).first - kept.begin());
  return strategy_->lane_keep() == FamilyStrategy::LaneKeep::kPromptKv || common == kept.size() ? common : 0;
}

void LaneCache::DropAnswer(int32_t lane, const char* what, const Status& s) {
  Warn(what, s);
  (void)backend_.Clear(lane);
  held_[static_cast<size_t>(lane)] = Held{};
  ++counters_.answers_dropped;
}

Status LaneCache::RewindToPrompt(int32_t lane, const std::string& cache_namespace, std::span<const Token> prompt,
                                 const cache::BatchClasses& classes) {
  SKIPPY_ASSIGN_OR_RETURN(const cache::Match m, EntryOf(cache_namespace, prompt, classes));
  return restorer_.RestoreRecurrentOnto(m.entry, lane, prompt.size());
}

bool LaneCache::KeptAnswerToPrefill(int32_t lane, Held& held) {
  held.answer_kept = false;
  const size_t from = held.answer_from;
  const std::span<const Token> kept = std::span(held.tokens).subspan(from);
  std::vector<Token> next(kept.begin(), kept.end());
  // A next turn that does not continue the prompt (or is not known) leaves the exchange as recorded.
  if (!Predict(std::span(held.tokens).first(from), next, held.next_turn)) return false;
  const size_t served = KeptServes(kept, next);
  if (served == next.size()) return false;
  auto fail = [&](const char* what, const Status& s) {
    DropAnswer(lane, what, s);
    return false;
  };
  if (strategy_->lane_keep() == FamilyStrategy::LaneKeep::kPromptKv) {
    if (Status s = backend_.Truncate(lane, static_cast<int32_t>(from + served));
        !s.ok() || backend_.SequenceLength(lane) != static_cast<int32_t>(from + served)) {
      return fail("answer prefill: cut back", s.ok() ? absl::InternalError("the lane holds another length") : s);
    }
    held.tokens.resize(from + served);
  } else if (served < kept.size()) {
    // The prompt end's recurrent state comes back from its entry; where that is gone, the lane
    // keeps the exchange as recorded (and serves a prompt that extends it).
    const std::span<const Token> prompt = std::span(held.tokens).first(from);
    if (Status s = RewindToPrompt(lane, held.cache_namespace, prompt, cache::BatchClasses::Of(from, {}, MinBatch()));
        !s.ok()) {
      if (!absl::IsNotFound(s)) return fail("answer prefill: recurrent restore", s);
      ++counters_.answers_dropped;
      return false;
    }
    if (backend_.SequenceLength(lane) != static_cast<int32_t>(from)) {
      return fail("answer prefill", absl::InternalError("the lane was not cut back"));
    }
    held.tokens.resize(from);
  }
  // A hybrid lane that holds all it computed goes on from there.
  held.answer.assign(next.begin() + static_cast<ptrdiff_t>(held.tokens.size() - from), next.end());
  held.classes = cache::BatchClasses::Of(held.tokens.size(), {}, MinBatch());
  return true;
}

void LaneCache::PrefillAnswer(int32_t lane, size_t max_rows) {
  Held& held = held_[static_cast<size_t>(lane)];
  // A Clear since the job: its records would be unreachable.
  if (!TenantOf(held.cache_namespace)) {
    held.answer.clear();
    held.answer_kept = false;
    ++counters_.answers_dropped;
    return;
  }
  auto fail = [&](const char* what, const Status& s) { DropAnswer(lane, what, s); };
  if (held.answer_kept && !KeptAnswerToPrefill(lane, held)) return;
  if (!Predict(held.tokens, held.answer, held.next_turn)) {
    // A hybrid lane keeps its decoded rows, as without idle work.
    held.answer.clear();
    ++counters_.answers_dropped;
    return;
  }
  const auto n = static_cast<int32_t>(held.tokens.size());
  if (held.answer_decoded) {
    if (Status s = RewindToPrompt(lane, held.cache_namespace, held.tokens, held.classes); !s.ok()) {
      // The lane still holds the prompt and the decoded rows, as without idle work.
      held.answer.clear();
      ++counters_.answers_dropped;
      if (!absl::IsNotFound(s)) fail("answer prefill: recurrent restore", s);
      return;
    }
    held.answer_decoded = false;
    if (backend_.SequenceLength(lane) != n) return fail("answer prefill", absl::InternalError("the lane was not cut back"));
  }
  // The last batch keeps the smallest exact batch too.
  const size_t left = held.answer.size();
  size_t rows = std::min(left, max_rows);
  if (rows < left && left - rows < MinBatch()) rows = left - MinBatch();
  const std::span<const Token> batch = std::span(held.answer).first(rows);
  if (Status s = backend_.Prefill(lane, batch, n); !s.ok()) return fail("answer prefill", s);
  held.tokens.insert(held.tokens.end(), batch.begin(), batch.end());
  held.answer.erase(held.answer.begin(), held.answer.begin() + static_cast<ptrdiff_t>(rows));
  held.classes = cache::BatchClasses::Of(held.tokens.size(), {}, MinBatch());
  counters_.answer_prefill_tokens += rows;
  if (!held.answer.empty()) return;
  // The exchange, as a recompute of the next turn computes it: an entry for whichever lane the
  // next turn lands on.
  RecordExchangeEntry(lane, {backend_.facts().identity, held.cache_namespace}, held.tokens, held.classes);
  LaneEvent(lane, held.cache_namespace, held.tokens);
}

size_t LaneCache::Clear(const std::optional<std::string>& ns) {
  std::optional<std::string> scope_ns;
  if (ns) {
    scope_ns = Scope(*ns).cache_namespace;
    ++epochs_[*ns];
  } else {
    ++global_epoch_;
    epochs_.clear();
  }
  size_t erased = 0;
  for (cache::EntryId id : entries_.InNamespace(scope_ns)) erased += recorder_.Erase(id) ? 1 : 0;
  for (cache::PrefixTier* t : Tiers()) (void)t->Clear(ns);  // the same prefixes: not counted twice
  if (events_) {
    CacheEvent e;
    e.kind = CacheEvent::Kind::kCleared;
    e.all = !ns.has_value();
    e.tenant_namespace = ns.value_or("");
    events_(std::move(e));
  }
  return erased;
}

LaneCacheStats LaneCache::Stats() const {
  LaneCacheStats s;
  s.enabled = strategy_->serves();
  s.disabled_reason = options_.disabled_reason;
  s.strategy = std::string(strategy_->name());
  s.cache = cache_->Stats();
  s.tier_name = std::string(tier_->name());
  s.tier = tier_->Usage();
  s.records = counters_.records.load();
  s.record_skips = counters_.record_skips.load();
  s.evictions = counters_.evictions.load();
  s.stored_hits = counters_.stored_hits.load();
  s.lane_hits = counters_.lane_hits.load();
  s.answer_records = counters_.answer_records.load();
  s.answer_prefill_tokens = counters_.answer_prefill_tokens.load();
  s.answers_dropped = counters_.answers_dropped.load();
  s.answers_pending = counters_.answers_pending.load();
  s.recurrent_onto_hits = counters_.recurrent_onto_hits.load();
  s.disk_hits = counters_.disk_hits.load();
  s.shared_hits = counters_.shared_hits.load();
  if (disk_) s.disk = disk_->Stats();
  if (shared_) s.shared = shared_->Stats();
  return s;
}

void LaneCache::SetEventSink(CacheEventSink sink) {
  events_ = sink;
  recorder_.SetEventSink(std::move(sink));
}

std::string_view CacheEventKindName(CacheEvent::Kind kind) {
  switch (kind) {
    case CacheEvent::Kind::kStored: return "stored";
    case CacheEvent::Kind::kRemoved: return "removed";
    case CacheEvent::Kind::kCleared: return "cleared";
    case CacheEvent::Kind::kLane: return "lane";
  }
  return "?";
}

void LaneCache::FlushTiers() {
  for (cache::PrefixTier* t : Tiers()) t->Flush();
}

}  // namespace skippy::lane_cache
