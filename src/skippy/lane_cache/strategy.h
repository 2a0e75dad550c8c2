// FamilyStrategy: what differs between kinds of model family on the request path, in one place per
// kind. The lane cache (LaneCache, Restorer) runs the same steps for every family and asks its
// strategy at each point where families differ:
//
//   dense           ResidentKv, plain attention KV: a lane keeps its last prompt's KV and is cut
//                   back to a shared prefix; the prompt end is recorded once the first token is
//                   out; a stored entry serves any shorter prefix.
//   sliding-window  ResidentKv with SWA layers: as dense, but an entry longer than the window
//                   keeps only the window of its last tokens and serves its exact length only, so
//                   entries are recorded at planned boundaries during prefill (and where a lane cut
//                   leaves a prompt), and a padded import must save enough to beat the lane.
//   hybrid          KvRecurrent, attention KV + recurrent state in one sequence, full attention:
//                   a lane keeps its attention KV, a hit within it restores only the recurrent
//                   state; boundaries copy the recurrent state only and are turned into entries
//                   from one export once the first token is out.
//   recurrent       KvRecurrent otherwise: exact-boundary entries, each exported where it is.
//   disabled        the family is not certified, or the cache is off: every job misses with
//                   "cache-disabled" and nothing is recorded, but prefill is cut as the family's
//                   own strategy cuts it, so a --no-cache server computes the same numbers.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "skippy/cache/batch_classes.h"
#include "skippy/cache/prefix_identity.h"
#include "skippy/cache/radix_index.h"
#include "skippy/lane_cache/lane_backend.h"
#include "skippy/lane_cache/prefill_plan.h"
#include "skippy/lane_cache/recorder.h"
#include "skippy/lane_cache/stats.h"

namespace skippy::lane_cache {

class Restorer;

// One job on a lane, from LaneCache::Begin to LaneCache::Finish.
struct LaneJob {
  bool active = false;
  cache::PrefixScope scope;
  std::vector<Token> prompt;
  cache::BatchClasses classes;         // the prompt's (every prefill of it follows them)
  PrefillPlan plan;
  bool records = false;                // the strategy serves and the prompt is long enough
  bool prompt_end_pending = false;     // prompt-end records wait for the first token
  std::vector<PendingRecord> pending;  // hybrid boundaries whose attention KV is copied at the end
};

class FamilyStrategy {
 public:
  // What a lane keeps of its last job for the next one in the same namespace.
  enum class LaneKeep {
    kNothing,     // cleared
    kPromptKv,    // the prompt's KV, and the generated tokens' where one row is in the prompt's class
    kEverything,  // hybrids: recurrent state cannot be cut; the lane serves a prompt extending all it holds
  };
  struct Tools {
    LaneBackend& backend;
    Recorder& recorder;
    Restorer& restorer;
    LaneCacheCounters& counters;
    size_t record_stride = 64;
  };

  // The strategy of the family in `facts`; `serving` false (cache off) gives the disabled one,
  // planning prefill as the family's would.
  static std::unique_ptr<FamilyStrategy> For(const BackendFacts& facts, bool serving, const Tools& tools);
  // Whether the family in `facts` plans exact-boundary records: what For(...)->plans_boundaries()
  // gives, serving or not (skippy-server asks before it makes the cache).
  static bool PlansBoundaries(const BackendFacts& facts);

  explicit FamilyStrategy(const Tools& tools) : t_(tools) {}
  virtual ~FamilyStrategy() = default;

  virtual std::string_view name() const = 0;
  virtual bool serves() const { return true; }
  virtual LaneKeep lane_keep() const = 0;
  // Whether records are planned at boundaries before prefill (PrefillPlan, RecordPolicy).
  virtual bool plans_boundaries() const = 0;
  // Whether an entry of entry_tokens tokens serves its exact length only.
  virtual bool ExactOnly(size_t entry_tokens) const = 0;

  // Restore. How many of the `keep` tokens a lane cut may keep (0: the lane cannot be cut).
  virtual size_t UsableLaneTokens(int32_t /*lane*/, size_t keep) const { return keep; }
  // How many more tokens than the lane an entry serving `usable` tokens must give to be imported.
  virtual size_t ImportMargin(size_t /*usable*/) const { return 0; }
  // Brings the match's usable tokens into the lane. lane_agreed: how many of the prompt's first
  // tokens the lane already holds, computed in the prompt's batch classes.
  virtual Status Import(const cache::Match& match, int32_t lane, std::span<const Token> prompt, size_t lane_agreed) = 0;
  // After a restore that cut the lane to `keep` tokens; branch: where the prompt leaves the lane's.
  virtual void AfterLaneCut(int32_t /*lane*/, const LaneJob& /*job*/, size_t /*keep*/, size_t /*branch*/) {}

  // Records. At a planned boundary `end` < prompt size, during prefill (the lane holds end tokens).
  virtual void AtBoundary(int32_t /*lane*/, LaneJob& /*job*/, size_t /*end*/) {}
  // Once the first token is out (the lane holds exactly the prompt); planned_end: the plan records
  // the prompt end.
  virtual void AtPromptEnd(int32_t /*lane*/, LaneJob& /*job*/, bool /*planned_end*/) {}

 protected:
  Tools t_;
};

}  // namespace skippy::lane_cache
