#include "skippy/lane_cache/strategy.h"

#include <algorithm>

#include "skippy/lane_cache/restore.h"
#include "skippy/lane_cache/warn.h"

namespace skippy::lane_cache {

using cache::PayloadKind;

namespace {

class Disabled final : public FamilyStrategy {
 public:
  Disabled(const Tools& t, bool plans) : FamilyStrategy(t), plans_(plans) {}
  std::string_view name() const override { return "disabled"; }
  bool serves() const override { return false; }
  LaneKeep lane_keep() const override { return LaneKeep::kNothing; }
  bool plans_boundaries() const override { return plans_; }
  bool ExactOnly(size_t) const override { return true; }
  Status Import(const cache::Match&, int32_t, std::span<const Token>, size_t) override {
    return absl::FailedPreconditionError("the cache is off");
  }

 private:
  bool plans_;  // cut prefill where the family's own strategy records, so the numbers are the same
};

class Dense : public FamilyStrategy {
 public:
  using FamilyStrategy::FamilyStrategy;
  std::string_view name() const override { return "dense"; }
  LaneKeep lane_keep() const override { return LaneKeep::kPromptKv; }
  bool plans_boundaries() const override { return false; }
  bool ExactOnly(size_t) const override { return false; }
  // A stored (or spilled) entry: import its KV into the lane, then cut it to the usable prefix.
  Status Import(const cache::Match& m, int32_t lane, std::span<const Token> prompt, size_t) override {
    Status s = t_.restorer.ImportStored(m.entry.desc, lane, prompt.first(m.usable_tokens));
    if (s.ok() && m.usable_tokens < m.entry.tokens) s = t_.backend.Truncate(lane, static_cast<int32_t>(m.usable_tokens));
    if (s.ok()) ++t_.counters.stored_hits;
    return s;
  }
  void AtPromptEnd(int32_t lane, LaneJob& job, bool) override {
    t_.recorder.Resident(lane, job.scope, job.prompt, job.classes, ExactOnly(job.prompt.size()));
  }
};

class SlidingWindow final : public Dense {
 public:
  SlidingWindow(const Tools& t, int32_t n_swa, bool swa_full) : Dense(t), n_swa_(n_swa), swa_full_(swa_full) {}
  std::string_view name() const override { return "sliding-window"; }
  // Only a full-size SWA cache never overwrites a lane's older cells, so only then may a lane be
  // cut back to a shared prefix.
  LaneKeep lane_keep() const override { return swa_full_ ? LaneKeep::kPromptKv : LaneKeep::kNothing; }
  bool plans_boundaries() const override { return true; }
  // An entry longer than the window keeps only the window of its last tokens in the SWA layers.
  bool ExactOnly(size_t entry_tokens) const override { return entry_tokens > static_cast<size_t>(n_swa_); }
  size_t UsableLaneTokens(int32_t lane, size_t keep) const override {
    // The lane lost early sliding-window cells (never expected with a full-size SWA cache), or the
    // cut is shorter than a padded import, whose window would then hold padding cells.
    if (t_.backend.SequenceFirstPosition(lane) != 0) return 0;
    if (keep < static_cast<size_t>(t_.backend.PaddedPrefix(lane))) return 0;
    return keep;
  }
  // A padded import (an exact-length entry) stops the lane from later serving shorter prefixes
  // (LaneBackend::PaddedPrefix), so the lane wins unless the entry saves this many more tokens.
  size_t ImportMargin(size_t usable) const override { return ExactOnly(usable) ? kPaddedImportMinSaving : 0; }
  // The lane was cut where this prompt leaves its last one. An entry that long serves only its
  // exact length and the plan records only past the restored prefix, so record the cut now: the
  // next prompt that leaves at the same point (another question on the same document, once other
  // prompts have taken the lane) restores it. The lane holds exactly these tokens, computed in the
  // batches of a recompute.
  void AfterLaneCut(int32_t lane, const LaneJob& job, size_t keep, size_t branch) override {
    if (keep == branch && ExactOnly(keep) && keep >= t_.record_stride && keep >= t_.backend.facts().min_exact_batch &&
        job.records) {
      t_.recorder.Resident(lane, job.scope, std::span(job.prompt).first(keep), job.classes, true);
    }
  }
  void AtBoundary(int32_t lane, LaneJob& job, size_t end) override {
    t_.recorder.Resident(lane, job.scope, std::span(job.prompt).first(end), job.classes, ExactOnly(end));
  }

 private:
  static constexpr size_t kPaddedImportMinSaving = 64;
  int32_t n_swa_;
  bool swa_full_;
};

class Recurrent : public FamilyStrategy {
 public:
  using FamilyStrategy::FamilyStrategy;
  std::string_view name() const override { return "recurrent"; }
  LaneKeep lane_keep() const override { return LaneKeep::kNothing; }
  bool plans_boundaries() const override { return true; }
  // Recurrent state cannot be cut to a shorter prefix.
  bool ExactOnly(size_t) const override { return true; }
  Status Import(const cache::Match& m, int32_t lane, std::span<const Token> prompt, size_t) override {
    Status s = t_.restorer.ImportStored(m.entry.desc, lane, prompt.first(m.usable_tokens));
    if (s.ok()) ++t_.counters.stored_hits;
    return s;
  }
  void AtBoundary(int32_t lane, LaneJob& job, size_t end) override {
    t_.recorder.Recurrent(lane, job.scope, std::span(job.prompt).first(end), job.classes);
  }
  void AtPromptEnd(int32_t lane, LaneJob& job, bool planned_end) override {
    if (planned_end) t_.recorder.Recurrent(lane, job.scope, job.prompt, job.classes);
  }
};

class Hybrid final : public Recurrent {
 public:
  using Recurrent::Recurrent;
  std::string_view name() const override { return "hybrid"; }
  LaneKeep lane_keep() const override { return LaneKeep::kEverything; }
  // The lane's attention KV already holds the entry's tokens: bring back only the recurrent state,
  // as llama-server restores a context checkpoint.
  Status Import(const cache::Match& m, int32_t lane, std::span<const Token> prompt, size_t lane_agreed) override {
    if (lane_agreed >= m.usable_tokens && m.usable_tokens == m.entry.tokens) {
      Status s = t_.restorer.RestoreRecurrentOnto(m.entry, lane, m.usable_tokens);
      if (s.ok()) {
        ++t_.counters.recurrent_onto_hits;
        return s;
      }
      Warn("recurrent-only restore (importing the whole state instead)", s);
    }
    return Recurrent::Import(m, lane, prompt, lane_agreed);
  }
  // A boundary copies only the recurrent state, on the path to the first token; the attention KV
  // comes from one export at the prompt end (Recorder::Deferred).
  void AtBoundary(int32_t lane, LaneJob& job, size_t end) override {
    if (auto p = t_.recorder.CopyRecurrent(lane, end)) job.pending.push_back(std::move(*p));
  }
  void AtPromptEnd(int32_t lane, LaneJob& job, bool planned_end) override {
    t_.recorder.Deferred(lane, job.scope, job.prompt, job.classes, planned_end, job.pending);
    job.pending.clear();
  }
};

}  // namespace

bool FamilyStrategy::PlansBoundaries(const BackendFacts& facts) {
  return facts.family.enabled && (facts.family.payload == PayloadKind::kKvRecurrent || facts.n_swa > 0);
}

std::unique_ptr<FamilyStrategy> FamilyStrategy::For(const BackendFacts& facts, bool serving, const Tools& tools) {
  std::unique_ptr<FamilyStrategy> s;
  // Off, or uncertified: plan prefill as the family would (an uncertified family plans nothing).
  if (!serving || !facts.family.enabled) return std::make_unique<Disabled>(tools, PlansBoundaries(facts));
  if (facts.family.payload == PayloadKind::kKvRecurrent) {
    if (facts.hybrid_memory && facts.n_swa == 0) {
      s = std::make_unique<Hybrid>(tools);
    } else {
      s = std::make_unique<Recurrent>(tools);
    }
  } else if (facts.n_swa > 0) {
    s = std::make_unique<SlidingWindow>(tools, facts.n_swa, facts.swa_full);
  } else {
    s = std::make_unique<Dense>(tools);
  }
  return s;
}

}  // namespace skippy::lane_cache
