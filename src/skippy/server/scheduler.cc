#include "skippy/server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "skippy/certify/lane_batching.h"
#include "skippy/certify/state_handoff.h"
#include "skippy/common/strings.h"
#include "skippy/lane_cache/strategy.h"
#include "skippy/runtime/chat.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/sampler.h"
#include "skippy/server/cache_stats.h"
#include "skippy/server/class_decision.h"
#include "skippy/server/decode_groups.h"
#include "skippy/server/prefill_order.h"
#include "skippy/server/response.h"

namespace skippy::server {

using runtime::Token;

namespace {

// The errors of a job the server does not finish: its client went away (queued or running), or
// the server is stopping.
ApiError ClientWentAway() { return {499, "invalid_request_error", "cancelled", "the client went away"}; }
ApiError ShuttingDown() { return {503, "server_error", "shutting_down", "the server is stopping"}; }

// The shared tier's connection (--shared-redis); nullopt without one.
std::optional<cache::SharedTierOptions> SharedTierOptionsOf(const ServerOptions& o) {
  if (o.shared_host.empty()) return std::nullopt;
  cache::SharedTierOptions s;
  s.host = o.shared_host;
  s.port = o.shared_port;
  s.password = o.shared_password;
  s.key_prefix = o.shared_key_prefix;
  s.timeout_ms = o.shared_timeout_ms;
  return s;
}

lane_cache::LaneCacheOptions CacheOptionsOf(const ServerOptions& o) {
  lane_cache::LaneCacheOptions lo;
  lo.enabled = o.cache_enabled;
  lo.record_stride = o.record_stride;
  lo.max_records = o.max_records;
  lo.record_tail = o.record_tail;
  lo.cut_cost_rows = std::max(0.0, o.cut_cost_rows);
  lo.grid_budget = o.grid_budget;
  lo.prefill_chunk = o.prefill_chunk;
  lo.answer_prefill = o.answer_prefill_idle_ms >= 0;
  lo.max_entries = o.cache_entries;
  lo.max_bytes = std::max<uint64_t>(1, o.cache_ram_mib) << 20;
  lo.decoded_entries = o.decoded_entries;
  lo.decoded_bytes = std::max<uint64_t>(1, o.decoded_ram_mib) << 20;
  lo.disk_dir = o.cache_dir;
  lo.disk_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(o.cache_disk_gib * double(uint64_t{1} << 30)));
  lo.shared = SharedTierOptionsOf(o);
  return lo;
}

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

const char* SwitchName(ServerOptions::Switch s) {
  switch (s) {
    case ServerOptions::Switch::kOn: return "on";
    case ServerOptions::Switch::kOff: return "off";
    case ServerOptions::Switch::kAuto: return "auto";
  }
  return "auto";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(ServerOptions options, Metrics& metrics) : options_(std::move(options)), metrics_(metrics) {
  options_.lane_count = std::max<uint32_t>(1, options_.lane_count);
  // Every prefill batch keeps runtime::MinExactBatch rows, so a chunk holds at least two of them.
  const auto min_batch = static_cast<uint32_t>(runtime::MinExactBatch(options_.flash_attn, options_.min_exact_batch));
  options_.n_batch = std::max<uint32_t>(options_.n_batch, 2 * min_batch);
  options_.prefill_chunk = std::clamp<uint32_t>(options_.prefill_chunk, 2 * min_batch, options_.n_batch);
  // A tail record leaves at least one short batch (lane_cache::PlanPrefill makes it a long one after a
  // long message).
  if (options_.record_tail != 0) {
    options_.record_tail = std::max<uint32_t>(options_.record_tail, cache::BatchClasses::kMinShortBatch);
  }
  model_name_ = options_.model_alias.empty() ? std::filesystem::path(options_.model_path).stem().string()
                                             : options_.model_alias;
}

Scheduler::~Scheduler() { Stop(); }

Status Scheduler::Load() {
  // The cache dir is this server's before anything under it is read or written (the class
  // decision below, then the disk tier): a second server on it is refused here.
  if (!options_.cache_dir.empty()) {
    SKIPPY_ASSIGN_OR_RETURN(cache_dir_lock_, cache::CacheDirLock::Acquire(options_.cache_dir));
  }
  runtime::EngineOptions eo;
  eo.model_path = options_.model_path;
  // The same context whether the cache is on or off (--no-cache must compute the same numbers).
  eo.context.n_batch = options_.n_batch;
  eo.context.n_ubatch = options_.n_batch;
  eo.context.n_threads = options_.threads;
  eo.context.flash_attn = options_.flash_attn;
  eo.min_exact_batch = options_.min_exact_batch;
  eo.lane_count = options_.lane_count;
  // A lane stepping with others writes a pad row after its last token (Engine::DecodeStep). llama.cpp
  // rounds a lane's cells up to a multiple of 256, so with -c a multiple of 256 this costs 256
  // cells per lane (also for recurrent models, which then decode one lane at a time: the model is
  // not known before the context is made).
  // "auto" batches only in the one-row class (no pad row); main sets the class for "on".
  const uint32_t pad = options_.lane_count >= 2 && options_.lane_batching == ServerOptions::Switch::kOn
                           ? static_cast<uint32_t>(runtime::DecodeStepRows() - 1)
                           : 0;
  // One stream per lane (llama.cpp gives each n_ctx / n_seq_max cells) and no cache sequences: a
  // lane's cells start at cell 0 of its own stream, so a restored prefix sits exactly where a
  // recompute puts it. Sliding-window layers get the full per-lane size too, so a lane never
  // overwrites its own older cells within its context: its last prompt can be cut back to a
  // shared prefix (lane_cache::FamilyStrategy::LaneKeep), and new cells always land in position order.
  eo.context.kv_unified = false;
  eo.context.n_ctx = (options_.ctx_per_lane + pad) * options_.lane_count;
  eo.context.swa_full = true;
  eo.cache_seq_count = 0;
  SKIPPY_ASSIGN_OR_RETURN(engine_, runtime::Engine::Open(eo));
  // The prompt byte bound (PreparePrompt) reads every piece of the vocabulary once: here, not in
  // the first request.
  (void)engine_->model().MaxBytesPerToken();
  // Before anything that reads the batch classes: the startup checks, the backend's facts and the
  // entries' identity.
  DecideOneRowClass();
  // Before the backend copies the family decision: a learned family is enabled only here.
  const std::string learned_off =
      options_.cache_enabled && engine_->family().learned ? CertifyLearnedFamily() : std::string();
  SKIPPY_ASSIGN_OR_RETURN(backend_, lane_cache::EngineBackend::Create(*engine_, options_.prefill_chunk));
  lane_cache::LaneCacheOptions lo = CacheOptionsOf(options_);
  lo.disk_lock = cache_dir_lock_;
  if (!learned_off.empty()) {
    lo.enabled = false;
    lo.disabled_reason = learned_off;
    std::fprintf(stderr, "skippy-server: the cache is off: %s\n", learned_off.c_str());
  }
  if (lo.enabled && !engine_->family().enabled) {
    lo.disabled_reason = StrCat("the family is not certified: ", engine_->family().reason);
    std::fprintf(stderr, "skippy-server: the cache is disabled for this model: %s\n", engine_->family().reason.c_str());
  }
  // Restores are exact only if prefill results do not depend on where batches are cut (above
  // runtime::MinExactBatch rows); prove it for this model, build and CPU before serving hits.
  // --tpot-slo-ms cuts a prompt's batches where other lanes' steps leave room: with the cache off
  // too, an answer would then depend on the traffic beside it unless the same proof holds. The
  // check is proven on certified families' layouts only.
  const bool certified = engine_->family().enabled;
  const bool serves = lo.enabled && certified;
  std::string cuts_unproven = certified ? "" : StrCat("the family is not certified: ", engine_->family().reason);
  if (certified && (lo.enabled || options_.tpot_slo_ms > 0)) {
    lane_cache::ServeCheck check = lane_cache::CheckBeforeServing(*engine_);
    batch_split_json_ = std::move(check.report);
    if (!check.passed) cuts_unproven = check.reason;
    if (!check.passed && serves) {
      lo.enabled = false;
      lo.disabled_reason = check.reason;
      std::fprintf(stderr, "skippy-server: the cache is off: %s\n", check.reason.c_str());
    }
  }
  if (options_.tpot_slo_ms > 0 && !cuts_unproven.empty()) {
    slo_cuts_off_ = std::move(cuts_unproven);
    std::fprintf(stderr, "skippy-server: --tpot-slo-ms cuts no prefill batch: %s\n", slo_cuts_off_.c_str());
  }
  if (options_.cut_cost_rows >= 0) {
    cut_cost_json_ = {{"cost_rows", options_.cut_cost_rows}, {"given", true}};
  } else if (lo.enabled && options_.grid_budget > 0 && lane_cache::FamilyStrategy::PlansBoundaries(backend_->facts())) {
    // Exact-boundary records cut prefill batches: weigh them by what a cut costs on this model.
    auto cost = lane_cache::MeasureCutCost(*engine_, 0);
    if (cost.ok()) {
      lo.cut_cost_rows = cost->cost_rows;
      cut_cost_json_ = cost->ToJson();
    } else {
      std::fprintf(stderr, "skippy-server: the cut-cost measurement could not run (%s); the record grid is not held to a budget\n",
                   std::string(cost.status().message()).c_str());
    }
  }
  SKIPPY_ASSIGN_OR_RETURN(cache_, lane_cache::LaneCache::Create(lo, *backend_));
  cache_->SetEventSink([this](lane_cache::CacheEvent e) { events_.Append(std::move(e)); });
  if (const auto shared = cache_->Stats().shared; shared && !shared->connected) {
    std::fprintf(stderr, "skippy-server: the shared tier's Redis at %s does not answer; serving without it until it does\n",
                 shared->endpoint.c_str());
  }
  DecideLaneBatching();
  DecideRaggedSteps();
  DecideMixedSteps();
  DecideChunksTogether();
  lanes_.resize(options_.lane_count);
  thread_ = std::thread([this] { Loop(); });
  ready_ = true;
  return absl::OkStatus();
}

std::string Scheduler::CertifyLearnedFamily() {
  const std::string arch = engine_->family().family_key;
  if (engine_->family().payload == cache::PayloadKind::kKvRecurrent && engine_->model().n_swa() > 0) {
    // Its whole-state imports would put the window's cells where a state export leaves them, and
    // the short certification below never crosses a window: not proved, so not served.
    learned_json_ = {{"architecture", arch}, {"pass", false}, {"error", "recurrent state beside sliding-window attention"}};
    return StrCat("architecture '", arch, "' is outside the family table and keeps recurrent state beside "
                  "sliding-window attention, which the startup certification does not cover");
  }
  certify::StateHandoffOptions o;
  o.model_path = options_.model_path;
  o.model_id = engine_->options().model_id;
  o.threads = options_.threads;
  o.flash_attn = options_.flash_attn;
  o.batch_size = options_.n_batch;
  o.ctx_size = 512;
  o.prompt =
      "A library lends books for three weeks and films for one. Members renew a loan online twice unless "
      "another member has reserved the item; late returns cost a few cents a day.";
  o.cache_hit_repeats = 2;
  const auto t0 = Clock::now();
  auto run = certify::RunStateHandoff(o);
  const double ms = MsBetween(t0, Clock::now());
  learned_json_ = {{"architecture", arch}, {"payload", std::string(cache::PayloadKindName(engine_->family().payload))},
                   {"ms", ms}};
  if (!run.ok()) {
    learned_json_["pass"] = false;
    learned_json_["error"] = std::string(run.status().message());
    return StrCat("architecture '", arch, "' is outside the family table and its certification could not run: ",
                  run.status().message());
  }
  const nlohmann::json& r = run->report;
  learned_json_["pass"] = run->verdict == certify::Verdict::kPass;
  learned_json_["status"] = r.value("status", "");
  for (const char* k : {"restored_output_matches", "cache_hit_matches", "suffix_prefill_matches"}) {
    if (r.contains(k)) learned_json_[k] = r[k];
  }
  if (run->verdict != certify::Verdict::kPass) {
    return StrCat("architecture '", arch, "' is outside the family table and the certifier failed on this model (",
                  r.value("status", ""), "): a restored continuation differs from the recomputed one");
  }
  engine_->EnableLearnedFamily();
  std::fprintf(stderr, "skippy-server: architecture '%s' is outside the family table; the certifier passed on this "
               "model (%s, %.0f ms): cache on\n", arch.c_str(), std::string(cache::PayloadKindName(engine_->family().payload)).c_str(), ms);
  return "";
}

void Scheduler::DecideOneRowClass() {
  using Switch = ServerOptions::Switch;
  one_row_class_json_["mode"] = SwitchName(options_.one_row_class);
  std::string decided;
  // main sets an explicit "on" (and refuses it where there is no class); a Scheduler built
  // directly gets it here.
  if (options_.one_row_class == Switch::kOn) (void)runtime::SetOneRowClass(true);
  if (runtime::OneRowClass()) {
    decided = options_.one_row_class == Switch::kOn
                  ? "asked for (--one-row-class=on)"
                  : "lanes step together whatever a lone step costs (--lane-batching=on), in the class";
  } else if (options_.one_row_class == Switch::kOff) {
    decided = "off (--one-row-class=off)";
  } else if (!runtime::BatchInvariant() || !runtime::OneRowClassAvailable()) {
    decided = runtime::BatchInvariant() ? "this build has no one-row class" : "the stock kernels have no one-row class";
  } else {
    // Nothing has read the classes yet (Load calls this first), so the class can still change.
    // Replicas on a shared tier take the fleet's decision, a server with a disk tier the one it
    // kept there; only without either is it measured (class_decision.h).
    const double tolerance = OneRowClassTolerance();
    // One lane: its decode is held to the tolerance at a short context too, where attention is a
    // small part of a step and the class's products decide (docs/evidence/parity/).
    const bool short_context_too = tolerance == kLoneStepTolerance;
    const std::string key = ClassDecisionKey(
        *engine_, StrCat("MeasureLoneStep;tolerance=", tolerance, short_context_too ? ";short-context=32" : ""));
    const std::string agreement_name = StrCat("one-row-class;", key);
    std::optional<cache::SharedAgreement> fleet;
    if (const auto shared = SharedTierOptionsOf(options_)) fleet.emplace(*shared);
    auto fleet_failed = [&](const Status& s) {
      one_row_class_json_["shared_error"] = std::string(s.message());
      std::fprintf(stderr, "skippy-server: the shared tier holds no class decision for this replica (%s); deciding alone\n",
                   std::string(s.message()).c_str());
      fleet.reset();
    };
    std::optional<ClassDecision> decision;
    enum class Source { kMeasured, kShared, kDisk } source = Source::kMeasured;
    if (fleet) {
      if (auto agreed = fleet->Get(agreement_name); !agreed.ok()) {
        fleet_failed(agreed.status());
      } else if (agreed->has_value()) {
        decision = ClassDecisionOf(nlohmann::json::parse(**agreed, nullptr, /*allow_exceptions=*/false));
        if (decision) source = Source::kShared;
      }
    }
    if (!decision && cache_dir_lock_ != nullptr) {
      decision = LoadClassDecision(options_.cache_dir, key);
      if (decision) source = Source::kDisk;
    }
    if (!decision) {
      auto cost = MeasureLoneStep(*engine_);
      std::optional<StatusOr<LoneStepCost>> short_cost;
      if (cost.ok() && cost->ratio <= tolerance && short_context_too) short_cost = MeasureLoneStep(*engine_, kShortContext);
      if (!cost.ok() || (short_cost && !short_cost->ok())) {
        decided = StrCat("the lone-step measure could not run: ",
                         (!cost.ok() ? cost.status() : short_cost->status()).message());
      } else {
        const bool short_ok = !short_cost || (*short_cost)->ratio <= tolerance;
        decision = ClassDecision{cost->ratio <= tolerance && short_ok, cost->ToJson()};
        decision->measured["tolerance"] = tolerance;
        if (short_cost) decision->measured["short_context"] = (*short_cost)->ToJson();
        auto say = [&](const LoneStepCost& c) {
          std::fprintf(stderr,
                       "skippy-server: a lone decode step takes %.2f ms in the one-row class and %.2f ms without it "
                       "(medians; the median ratio of %zu back-to-back pairs is %.3fx, %zu tokens of context)\n",
                       c.class_ms, c.default_ms, c.pairs, c.ratio, c.context);
        };
        say(*cost);
        if (short_cost) say(**short_cost);
        std::fprintf(stderr, "skippy-server: the one-row class is %s (tolerance %.2fx%s)\n", decision->on ? "on" : "off",
                     tolerance, short_cost ? ", one lane: at both contexts" : "");
      }
    }
    // The fleet's decision is the first one proposed: a replica that measured (or read its disk)
    // while another proposed first takes the other's.
    if (decision && fleet && source != Source::kShared) {
      const std::string proposal = ToJson(*decision).dump();
      if (auto agreed = fleet->Propose(agreement_name, proposal); !agreed.ok()) {
        fleet_failed(agreed.status());
      } else if (auto theirs = ClassDecisionOf(nlohmann::json::parse(*agreed, nullptr, false)); !theirs) {
        fleet_failed(absl::DataLossError("the agreed value is not a class decision"));
      } else if (*agreed != proposal) {
        decision = std::move(theirs);
        source = Source::kShared;
      }
    }
    if (decision) {
      runtime::SetOneRowClass(decision->on);
      one_row_class_json_["measured"] = decision->measured;
      const char* on_off = decision->on ? "on" : "off";
      if (source == Source::kMeasured) {
        const bool short_failed = decision->measured.contains("short_context") && !decision->on;
        decided = decision->on   ? "a lone decode step costs no more than the tolerance in the class: on"
                  : short_failed ? "a lone decode step costs more than the tolerance in the class at a short context: off"
                                 : "a lone decode step costs more than the tolerance in the class: off";
      } else {
        const bool shared = source == Source::kShared;
        one_row_class_json_["kept"] = true;
        one_row_class_json_["kept_from"] = shared ? "shared" : "disk";
        decided = shared ? StrCat("as agreed by the replicas on the shared tier: ", on_off)
                         : StrCat("as measured by an earlier start, kept in the cache dir: ", on_off);
        std::fprintf(stderr, "skippy-server: the one-row class is %s, as %s\n", on_off,
                     shared ? "agreed on the shared tier" : "an earlier start on this cache dir measured");
      }
      // A restart on this directory then decides the same.
      if (cache_dir_lock_ != nullptr && source != Source::kDisk) {
        if (Status s = SaveClassDecision(options_.cache_dir, key, *decision); !s.ok()) {
          std::fprintf(stderr, "skippy-server: the class decision is not kept in the cache dir: %s\n",
                       std::string(s.message()).c_str());
        }
      }
    }
  }
  one_row_class_json_["decided"] = decided;
  one_row_class_json_["on"] = runtime::OneRowClass();
}

uint32_t Scheduler::StepOfAllLanesRows(size_t rows_per_lane) const {
  return static_cast<uint32_t>(rows_per_lane) * options_.lane_count;
}

std::string Scheduler::WhyLanesCannotStepTogether() {
  const uint32_t rows = StepOfAllLanesRows(runtime::DecodeStepRows());
  if (rows > engine_->context().options().n_ubatch) {
    return StrCat("a step of ", options_.lane_count, " lanes needs ", rows, " rows, more than the batch of ",
                  engine_->context().options().n_ubatch);
  }
  if (!engine_->CanDecodeSteps()) return "recurrent state cannot drop a pad row";
  auto check = certify::CheckLaneBatching(*engine_, 0, 1);
  if (!check.ok()) return StrCat("the lane-batching check could not run: ", check.status().message());
  lane_batching_json_["check"] = check->ToJson();
  if (!check->pass) return "the lane-batching check failed: a lane's logits depend on the lanes beside it";
  return "";
}

double Scheduler::OneRowClassTolerance() const {
  // In the class a lane steps with one row, so a step of every lane must fit a ubatch
  // (WhyLanesCannotStepTogether's first test; its lane-batching check runs in the class, later).
  const bool lanes_may_step_together = options_.lane_count >= 2 &&
                                       options_.lane_batching != ServerOptions::Switch::kOff &&
                                       StepOfAllLanesRows(1) <= engine_->context().options().n_ubatch;
  return lanes_may_step_together ? kLaneStepTolerance : kLoneStepTolerance;
}

void Scheduler::DecideLaneBatching() {
  using Switch = ServerOptions::Switch;
  lane_batching_json_["mode"] = SwitchName(options_.lane_batching);
  std::string no_batching;
  if (options_.lane_count < 2) {
    no_batching = "one lane";
  } else if (options_.lane_batching == Switch::kOff) {
    no_batching = "off (--lane-batching=off)";
  } else if (options_.lane_batching == Switch::kAuto && !runtime::OneRowClass()) {
    no_batching = StrCat("auto: lanes step together in the one-row class, which is off: ",
                         one_row_class_json_.value("decided", std::string()));
  } else {
    no_batching = WhyLanesCannotStepTogether();
  }
  if (no_batching.empty() && options_.lane_groups_measured) {
    // Which lanes step together is free (every split is exact): split by what steps cost here.
    if (auto costs = MeasureDecodeSteps(*engine_); costs.ok()) {
      decode_step_ms_ = costs->step_ms;
      lane_batching_json_["step_cost"] = costs->ToJson();
    } else {
      std::fprintf(stderr, "skippy-server: the decode-step measure could not run (%s); all decoding lanes step together\n",
                   std::string(costs.status().message()).c_str());
    }
  }
  if (no_batching.empty()) lane_batching_json_["groups"] = decode_step_ms_.empty() ? "all" : "measured";
  lane_batching_ = no_batching.empty();
  lane_batching_json_["on"] = lane_batching_;
  if (!lane_batching_) {
    lane_batching_json_["reason"] = no_batching;
    if (options_.lane_count >= 2 && options_.lane_batching != Switch::kOff &&
        (runtime::OneRowClass() || options_.lane_batching == Switch::kOn)) {
      std::fprintf(stderr, "skippy-server: lanes decode one at a time: %s\n", no_batching.c_str());
    }
  }
}

void Scheduler::DecideRaggedSteps() {
  nlohmann::json& j = lane_batching_json_["ragged_steps"];
  j["mode"] = options_.ragged_steps ? "on" : "off";
  std::string why;
  if (!options_.ragged_steps) {
    why = "off (--ragged-steps off)";
  } else if (!lane_batching_) {
    why = "lanes do not step together";
  } else if (options_.lane_count < 3) {
    why = "fewer than three lanes: lanes that step together follow each other";
  } else if (!runtime::RaggedSplitAvailable()) {
    why = "this llama.cpp build has no ragged split (built without the patch series)";
  } else if (!engine_->CanStepLanesApart()) {
    why = runtime::OneRowClass() ? "a recurrent model or a learned architecture: lanes step in runs of consecutive ids"
                                 : "lanes step with pad rows (no one-row class): lanes step in runs of consecutive ids";
  } else {
    auto check = certify::CheckLaneBatching(*engine_, 0, 2);
    if (!check.ok()) {
      why = StrCat("the lane-batching check of lanes 0 and 2 could not run: ", check.status().message());
    } else {
      j["check"] = check->ToJson();
      if (!check->pass) why = "the lane-batching check of lanes 0 and 2 failed: a lane's logits depend on the lanes beside it";
    }
  }
  ragged_steps_ = why.empty();
  j["on"] = ragged_steps_;
  if (!ragged_steps_) {
    j["reason"] = why;
    if (lane_batching_ && options_.ragged_steps && options_.lane_count >= 3 && runtime::OneRowClass()) {
      std::fprintf(stderr, "skippy-server: decoding lanes step in runs of consecutive ids: %s\n", why.c_str());
    }
  }
}

void Scheduler::DecideMixedSteps() {
  mixed_steps_json_["mode"] = options_.mixed_steps ? "on" : "off";
  mixed_steps_ = WhyNoStepsWithChunks(options_.mixed_steps, "off (--mixed-steps off, the default)",
                                      "decode rows step apart from prompt chunks", /*chunks_together=*/false,
                                      mixed_steps_json_)
                     .empty();
}

std::string Scheduler::WhyNoStepsWithChunks(bool asked, std::string_view off, std::string_view apart,
                                            bool chunks_together, nlohmann::json& json) {
  std::string why;
  if (!asked) {
    why = off;
  } else if (!lane_batching_) {
    why = "lanes do not step together";
  } else if (!runtime::RaggedSplitAvailable()) {
    why = "this llama.cpp build has no ragged split (built without the patch series)";
  } else if (!engine_->CanStepWithChunk()) {
    why = StrCat("recurrent state or a learned architecture: ", apart);
  } else {
    why = WhyStepsWithChunksFail(chunks_together);
    if (!steps_with_chunks_check_json_.is_null()) json["check"] = steps_with_chunks_check_json_;
  }
  json["on"] = why.empty();
  if (!why.empty()) {
    json["reason"] = why;
    if (lane_batching_ && asked) std::fprintf(stderr, "skippy-server: %s: %s\n", std::string(apart).c_str(), why.c_str());
  }
  return why;
}

std::string Scheduler::WhyStepsWithChunksFail(bool chunks_together) {
  if (!steps_with_chunks_check_) {
    auto check = certify::CheckStepWithChunk(*engine_, 0, 1, options_.lane_count >= 3 ? 2 : -1);
    if (check.ok()) {
      steps_with_chunks_check_json_ = check->ToJson();
      steps_with_chunks_check_ = *check;
    } else {
      steps_with_chunks_check_ = check.status();
    }
  }
  if (!steps_with_chunks_check_->ok()) {
    return StrCat("the step-with-chunk check could not run: ", steps_with_chunks_check_->status().message());
  }
  const certify::StepWithChunkReport& r = **steps_with_chunks_check_;
  if (!r.chunk_equal || !r.steps_equal || !r.next_equal) {
    return "the step-with-chunk check failed: a row's logits differ beside a chunk";
  }
  if (chunks_together && !r.chunks_together_equal) {
    return "the step-with-chunk check failed: a row's logits differ beside another lane's chunk";
  }
  return "";
}

void Scheduler::DecideChunksTogether() {
  chunks_together_json_["mode"] = ChunksTogetherName(options_.chunks_together);
  chunks_together_ = WhyNoStepsWithChunks(options_.chunks_together != ChunksTogether::kOff,
                                          "off (--chunks-together off, the default)",
                                          "each lane's prompt chunk is a graph of its own", /*chunks_together=*/true,
                                          chunks_together_json_)
                         .empty();
}

Status Scheduler::Submit(std::shared_ptr<Job> job) {
  if (!ready_) return absl::UnavailableError("the model is loading");
  std::lock_guard lock(mu_);
  if (stop_) return absl::UnavailableError("the server is stopping");
  // Requests whose clients went away while queued leave the queue before it counts as full.
  if (busy_ + queue_.size() >= options_.lane_count + options_.queue_size) DropCancelledLocked();
  if (busy_ + queue_.size() >= options_.lane_count + options_.queue_size) {
    return absl::ResourceExhaustedError(StrCat("all ", options_.lane_count, " lanes are busy and ", queue_.size(),
                                               " requests are waiting; retry later"));
  }
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return absl::OkStatus();
}

StatusOr<size_t> Scheduler::ClearCache(const std::optional<std::string>& ns) {
  if (!ready_) return absl::UnavailableError("the model is loading");
  std::promise<size_t> done;
  auto fut = done.get_future();
  {
    std::lock_guard lock(mu_);
    if (stop_) return absl::UnavailableError("the server is stopping");
    controls_.push_back({ns, &done});
    cv_.notify_all();
  }
  return fut.get();
}

bool Scheduler::cache_serving() const { return cache_ && cache_->Stats().enabled; }

nlohmann::json Scheduler::CacheStats() const {
  if (!ready_) return nlohmann::json::object();
  nlohmann::json j = CacheStatsJson(cache_->Stats());
  j["batch_split"] = batch_split_json_;
  j["cut_cost"] = cut_cost_json_;
  j["batch_invariant"] = runtime::BatchInvariant();
  j["flash_attn"] = options_.flash_attn;
  j["family"] = engine_->family().family_key;
  j["payload"] = std::string(cache::PayloadKindName(engine_->family().payload));
  if (!learned_json_.is_null()) j["learned_family"] = learned_json_;
  j["one_row_class"] = one_row_class_json_;
  j["lane_batching"] = lane_batching_json_;
  j["lane_batching"]["steps_together"] = steps_together_.load();
  j["lane_batching"]["ragged_steps"]["steps"] = ragged_steps_count_.load();
  j["mixed_steps"] = mixed_steps_json_;
  j["mixed_steps"]["steps_with_chunk"] = steps_with_chunk_.load();
  j["chunks_together"] = chunks_together_json_;
  j["chunks_together"]["groups"] = chunk_groups_.load();
  j["shared_prefill_waits"] = shared_prefill_waits_.load();
  j["slo"] = {{"ttft_ms", options_.ttft_slo_ms},
              {"tpot_ms", options_.tpot_slo_ms},
              {"batches_cut", batches_cut_.load()},
              {"cuts_off_reason", slo_cuts_off_},
              {"prefill_row_ms", prefill_row_ms_.load()},
              {"decode_lane_ms", decode_lane_ms_.load()}};
  return j;
}

Gauges Scheduler::gauges() const {
  Gauges g;
  g.lanes_total = options_.lane_count;
  g.loading = !ready_;
  {
    std::lock_guard lock(mu_);
    g.lanes_busy = static_cast<uint32_t>(busy_);
    g.queue_depth = queue_.size();
  }
  if (ready_) FillCacheGauges(cache_->Stats(), g);
  return g;
}

void Scheduler::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
    events_.Close();
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  for (auto& job : queue_) job->Finish("", ShuttingDown(), {});
  queue_.clear();
  for (auto& c : controls_) c.done->set_value(0);
  controls_.clear();
}

void Scheduler::DropCancelledLocked() {
  std::erase_if(queue_, [&](const std::shared_ptr<Job>& job) {
    if (!job->cancelled()) return false;
    job->Finish("", ClientWentAway(), {});
    metrics_.CountCancelled();
    return true;
  });
}

std::vector<int32_t> Scheduler::AdmitLocked() {
  std::vector<int32_t> admitted;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].job) continue;
    while (!queue_.empty() && queue_.front()->cancelled()) {
      queue_.front()->Finish("", ClientWentAway(), {});
      queue_.pop_front();
      metrics_.CountCancelled();
    }
    if (queue_.empty()) break;
    lanes_[i] = Lane{};
    lanes_[i].admitted = admissions_++;
    lanes_[i].job = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    admitted.push_back(static_cast<int32_t>(i));
  }
  return admitted;
}

void Scheduler::Loop() {
  while (true) {
    std::vector<Control> controls;
    {
      std::unique_lock lock(mu_);
      const bool active = std::any_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.job != nullptr; });
      auto work = [&] { return stop_ || active || !controls_.empty() || (!queue_.empty() && busy_ < lanes_.size()); };
      // Idle work (answers to prefill) waits until nothing has run for answer_prefill_idle_ms, so a
      // client that sends its next request at once finds the engine free.
      if (!active && cache_->HasIdleWork()) {
        const auto idle_from = idle_since_ + std::chrono::milliseconds(options_.answer_prefill_idle_ms);
        if (!cv_.wait_until(lock, idle_from, work)) {
          lock.unlock();
          cache_->IdleStep(options_.answer_prefill_rows);
          continue;
        }
      } else {
        cv_.wait(lock, work);
      }
      if (stop_) {
        for (size_t i = 0; i < lanes_.size(); ++i) {
          if (lanes_[i].job) {
            lanes_[i].job->Finish("", ShuttingDown(), {});
            lanes_[i].job.reset();
          }
        }
        return;
      }
      controls.assign(controls_.begin(), controls_.end());
      controls_.clear();
      AdmitLocked();
    }
    for (const Control& c : controls) c.done->set_value(cache_->Clear(c.tenant_namespace));
    if (lane_batching_) {
      StepTogether();
      continue;
    }
    // One round: every busy lane steps once. A job that arrives during the round and finds a free
    // lane starts at once (its restore and first chunk, and its first token when that is all it
    // needs) instead of waiting for the round to end.
    std::vector<char> stepped(lanes_.size(), 0);
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (!lanes_[i].job || stepped[i]) continue;
      Step(static_cast<int32_t>(i));
      stepped[i] = 1;
      std::vector<int32_t> admitted;
      {
        std::lock_guard lock(mu_);
        admitted = AdmitLocked();
      }
      for (int32_t id : admitted) {
        Step(id);
        stepped[static_cast<size_t>(id)] = 1;
      }
    }
  }
}

void Scheduler::StepTogether() {
  const size_t n = lanes_.size();
  // Prefill chunks up to a chunk's worth of rows (PrefillTurn). A job admitted while they run
  // restores at once and competes for the rest of the budget, instead of waiting for the decode
  // step and the next turn.
  PrefillTurn turn(n, std::min<size_t>(options_.prefill_chunk, PrefillRowsNow()));
  // The jobs that stepped beside a chunk this turn, by lane, as their admission number + 1 (a lane
  // freed then may take a job that begins decoding in this turn's closing step).
  std::vector<uint64_t> stepped(n, 0);
  auto has_stepped = [&](size_t i) { return lanes_[i].job && stepped[i] == lanes_[i].admitted + 1; };
  while (true) {
    StartAdmitted();
    std::vector<PrefillCandidate> candidates;
    std::vector<size_t> prefilling;
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < n; ++i) {
      const Lane& l = lanes_[i];
      // A lane waiting for its turn is freed as soon as its client goes away.
      if (!l.job || l.phase != Phase::kPrefill || !turn.Open(i) || FinishIfCancelled(static_cast<int32_t>(i))) continue;
      candidates.push_back(CandidateOf(l, l.pos, l.next_chunk, now));
      prefilling.push_back(i);
    }
    const std::optional<size_t> pick = turn.Next(candidates, 2 * n);
    if (!pick) break;
    const auto id = static_cast<int32_t>(prefilling[*pick]);
    turn.Ran(static_cast<size_t>(id), candidates[*pick]);
    // With chunks together, the chunks the turn runs next join this one's graph where they may.
    std::vector<PlannedChunk> group = {{id, 0}};
    if (chunks_together_) GrowChunkGroup(turn, group, 2 * n);
    auto in_group = [&](size_t i) {
      return std::any_of(group.begin(), group.end(), [&](const PlannedChunk& c) { return c.lane == static_cast<int32_t>(i); });
    };
    for (size_t i : prefilling) lanes_[i].passed_over = in_group(i) ? 0 : lanes_[i].passed_over + group.size();
    if (mixed_steps_ || chunks_together_) {
      // The decoding lanes that have not stepped this turn step in the chunks' llama_decode (with
      // mixed steps).
      std::vector<int32_t> decoding;
      for (size_t i = 0; i < n && mixed_steps_; ++i) {
        if (lanes_[i].job && lanes_[i].phase == Phase::kGenerate && !has_stepped(i)) {
          decoding.push_back(static_cast<int32_t>(i));
          stepped[i] = lanes_[i].admitted + 1;  // cleared again below unless it stepped
        }
      }
      std::erase_if(group, [&](const PlannedChunk& c) { return FinishIfCancelled(c.lane); });
      std::vector<int32_t> did;
      if (group.size() == 1) did = PrefillChunk(group[0].lane, decoding, group[0].end);
      if (group.size() > 1) did = PrefillChunks(group, decoding);
      for (int32_t i : decoding) {
        if (std::find(did.begin(), did.end(), i) == did.end()) stepped[static_cast<size_t>(i)] = 0;
      }
    } else {
      Step(id);
    }
    std::lock_guard lock(mu_);
    AdmitLocked();
  }
  // Then one token for every decoding lane that has not stepped beside a chunk, the lanes that have
  // just sampled their first token too.
  std::vector<int32_t> decoding;
  for (size_t i = 0; i < n; ++i) {
    if (lanes_[i].job && lanes_[i].phase == Phase::kGenerate && !has_stepped(i)) decoding.push_back(static_cast<int32_t>(i));
  }
  for (const std::vector<int32_t>& group : DecodeGroups(decoding, decode_step_ms_, ragged_steps_)) GenerateTogether(group);
}

void Scheduler::StartAdmitted() {
  // In the order they came, so that every prefill left is known (an exact repeat answers here),
  // unless one waits for a prefix that another lane is computing.
  std::vector<size_t> starting;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].job && lanes_[i].phase == Phase::kStart) starting.push_back(i);
  }
  std::sort(starting.begin(), starting.end(), [&](size_t a, size_t b) { return lanes_[a].admitted < lanes_[b].admitted; });
  for (size_t i : starting) {
    const auto id = static_cast<int32_t>(i);
    if (!FinishIfCancelled(id) && !WaitsForSharedPrefill(id)) StartJob(id);
  }
}

bool Scheduler::FinishIfCancelled(int32_t id) {
  if (!lanes_[id].job->cancelled()) return false;
  metrics_.CountCancelled();
  FinishLane(id, "", ClientWentAway());
  return true;
}

void Scheduler::Step(int32_t id) {
  if (FinishIfCancelled(id)) return;
  Lane& lane = lanes_[id];
  switch (lane.phase) {
    case Phase::kStart:
      if (WaitsForSharedPrefill(id)) break;
      StartJob(id);
      // The restore and the first chunk are one step: a new job does not wait a round to start.
      if (lane.job && lane.phase == Phase::kPrefill) PrefillChunk(id);
      break;
    case Phase::kPrefill: PrefillChunk(id); break;
    case Phase::kGenerate: Generate(id); break;
  }
}

bool Scheduler::WaitsForSharedPrefill(int32_t id) {
  Lane& lane = lanes_[id];
  if (!cache_->strategy().serves()) return false;
  std::vector<InFlightPrefill> in_flight;
  std::vector<int32_t> in_flight_lanes;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    const Lane& l = lanes_[i];
    if (!l.job || l.phase != Phase::kPrefill) continue;
    in_flight.push_back({l.job->prompt().tokens, l.job->tenant_namespace(), l.timings.cache_n, l.pos});
    in_flight_lanes.push_back(static_cast<int32_t>(i));
  }
  const Job& job = *lane.job;
  const std::vector<runtime::Token>& prompt = job.prompt().tokens;
  // Where the job would restore to from in_flight[i]: the other's whole prompt when it holds it
  // (its prompt-end record; an exact repeat, its decoded result), else the shared prefix, leaving
  // the job a batch to prefill (an exact-boundary family records there: LaneCache::RecordAlso).
  auto restore_at = [&](size_t i, size_t shared) {
    const size_t other_n = in_flight[i].prompt.size();
    if (shared >= other_n) return other_n;
    return std::min(shared, prompt.size() - std::min(prompt.size(), cache_->MinBatch()));
  };
  auto restorable = [&](size_t i, size_t shared) {
    const lane_cache::LaneCache::SharedRecords r =
        cache_->RecordsWithin(in_flight_lanes[i], restore_at(i, shared), in_flight[i].pos);
    return SharedRestore{r.now, r.later};
  };
  const std::optional<SharedPrefill> wait =
      SharedPrefillToWaitFor(prompt, job.tenant_namespace(), in_flight, kMinSharedPrefill, restorable);
  if (!wait) return false;
  if (lane.waiting_since == Clock::time_point{}) {
    lane.waiting_since = Clock::now();
    shared_prefill_waits_.fetch_add(1);
  }
  // The record the decision counted on (none to add where one is planned there already). The chunk
  // ends up to other.pos stay as they were, so next_chunk still points past them.
  Lane& other = lanes_[in_flight_lanes[wait->index]];
  const size_t at = restore_at(wait->index, wait->shared);
  if (std::optional<std::vector<size_t>> ends = cache_->RecordAlso(in_flight_lanes[wait->index], at, other.pos)) {
    other.chunk_ends = std::move(*ends);
  }
  return true;
}

void Scheduler::StartJob(int32_t id) {
  Lane& lane = lanes_[id];
  Job& job = *lane.job;
  lane.started = Clock::now();
  lane.timings.queue_ms = MsBetween(job.arrival(), lane.started);
  if (lane.waiting_since != Clock::time_point{}) lane.timings.prefix_wait_ms = MsBetween(lane.waiting_since, lane.started);
  const std::vector<Token>& prompt = job.prompt().tokens;

  runtime::SamplingParams sp = job.request().sampling;
  if (!job.request().seed_given) sp.seed = std::random_device{}();
  auto sampler = runtime::Sampler::Create(sp, engine_->model(), prompt);
  if (!sampler.ok()) {
    FinishLane(id, "", FromStatus(sampler.status()));
    return;
  }
  lane.sampler = std::move(*sampler);

  const Clock::time_point restore_start = Clock::now();
  lane_cache::JobStart r =
      cache_->Begin(id, job.tenant_namespace(), prompt, job.prompt().message_boundaries);
  lane.timings.restore_ms = MsBetween(restore_start, Clock::now());
  lane.chunk_ends = std::move(r.chunk_ends);
  lane.pos = r.restored;
  lane.timings.cache_n = r.restored;
  lane.timings.prompt_n = prompt.size() - r.restored;
  lane.timings.cache_payload = r.payload;
  lane.timings.cache_tier = r.tier;
  lane.timings.cache_miss_reason = r.miss_reason;
  lane.timings.decoded_result_hit = r.decoded != nullptr;
  if (r.miss_reason.empty()) {
    metrics_.CountHit(r.decoded != nullptr);
  } else {
    metrics_.CountMiss(r.miss_reason);
  }
  metrics_.AddPromptTokens(r.restored, prompt.size() - r.restored);
  if (r.decoded) {
    lane.logits = r.decoded->logits;
    lane.prefill_done = Clock::now();
    lane.phase = Phase::kGenerate;
    EmitToken(id);  // the first token needs no decode: answer it in this step
    return;
  }
  lane.next_chunk = 0;
  while (lane.next_chunk < lane.chunk_ends.size() && lane.chunk_ends[lane.next_chunk] <= lane.pos) {
    ++lane.next_chunk;
  }
  lane.phase = Phase::kPrefill;
}

PrefillCandidate Scheduler::CandidateOf(const Lane& lane, size_t pos, size_t next_chunk, Clock::time_point now) const {
  const size_t rows_left = lane.job->prompt().tokens.size() - pos;
  const bool late = options_.ttft_slo_ms > 0 &&
                    static_cast<double>(rows_left) * prefill_row_cost_.per_unit() > TtftLeftMs(lane, now);
  return {rows_left, lane.admitted, lane.passed_over, lane.chunk_ends[next_chunk] - pos, late};
}

double Scheduler::TtftLeftMs(const Lane& lane, Clock::time_point now) const {
  return options_.ttft_slo_ms - MsBetween(lane.job->arrival(), now);
}

size_t Scheduler::PrefillRowsNow(const Lane* lane) const {
  if (options_.tpot_slo_ms <= 0) return SIZE_MAX;
  const Clock::time_point now = Clock::now();
  std::vector<DecodingLaneClock> clocks;
  for (const Lane& l : lanes_) {
    if (l.job && l.phase == Phase::kGenerate) {
      clocks.push_back({l.generated, MsBetween(l.first_token, now), l.job->max_tokens() - l.generated});
    }
  }
  const double row_ms = prefill_row_cost_.per_unit();
  const double decode_ms = decode_lane_cost_.per_unit() * static_cast<double>(clocks.size());
  const std::optional<size_t> rows =
      PrefillRowsWithinTpot(options_.tpot_slo_ms, clocks, decode_ms, row_ms, kMinPrefillPiece);
  if (!rows) return SIZE_MAX;
  if (lane != nullptr && options_.ttft_slo_ms > 0) {
    if (TtftOutranksTpot(TtftLeftMs(*lane, now), lane->job->prompt().tokens.size() - lane->pos, *rows, row_ms, decode_ms)) {
      return SIZE_MAX;
    }
  }
  return *rows;
}

size_t Scheduler::PlanChunk(int32_t id) {
  Lane& lane = lanes_[id];
  if (!slo_cuts_off_.empty()) return lane.chunk_ends[lane.next_chunk];
  if (const size_t rows = PrefillRowsNow(&lane); lane.chunk_ends[lane.next_chunk] - lane.pos > rows) {
    if (std::optional<std::vector<size_t>> ends = cache_->CutBatch(id, lane.pos, rows)) {
      lane.chunk_ends = std::move(*ends);
      batches_cut_.fetch_add(1);
    }
  }
  return lane.chunk_ends[lane.next_chunk];
}

void Scheduler::GrowChunkGroup(PrefillTurn& turn, std::vector<PlannedChunk>& group, size_t overdue) {
  const size_t n_ubatch = engine_->context().options().n_ubatch;
  const double graph_ms = !decode_step_ms_.empty() ? decode_step_ms_[0] : decode_lane_cost_.per_unit();
  const ChunkGroupCosts costs{graph_ms, prefill_row_cost_.per_unit()};
  auto prompt_size = [&](int32_t id) { return lanes_[id].job->prompt().tokens.size(); };
  group[0].end = PlanChunk(group[0].lane);
  size_t rows = group[0].end - lanes_[group[0].lane].pos;
  while (true) {
    // The turn's next pick among every open lane, those in the group as they will be after their
    // chunk: where that is a lane of the group (a hit's tail after its branch point), the group
    // ends, so no chunk goes before a chunk the turn would have run first.
    std::vector<PrefillCandidate> candidates;
    std::vector<int32_t> lane_of;
    std::vector<char> of_group;
    size_t decoding = 0, first_tokens = 0;
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < lanes_.size(); ++i) {
      const Lane& l = lanes_[i];
      const auto id = static_cast<int32_t>(i);
      if (l.job && l.phase == Phase::kGenerate) ++decoding;
      if (!l.job || l.phase != Phase::kPrefill || !turn.Open(i) || l.job->cancelled()) continue;
      size_t pos = l.pos, next_chunk = l.next_chunk;
      const auto m = std::find_if(group.begin(), group.end(), [&](const PlannedChunk& c) { return c.lane == id; });
      if (m != group.end()) {
        if (m->end == prompt_size(id)) continue;
        pos = m->end;
        ++next_chunk;
      }
      of_group.push_back(m != group.end());
      candidates.push_back(CandidateOf(l, pos, next_chunk, now));
      lane_of.push_back(id);
    }
    // The first tokens that wait for the group's graph: its chunks that end their prompt. (A lane of
    // the group whose next chunk would follow in this turn is not delayed by a chunk that the turn
    // runs before that one anyway.)
    for (const PlannedChunk& c : group) {
      if (c.end == prompt_size(c.lane)) ++first_tokens;
    }
    const std::optional<size_t> pick = turn.Next(candidates, overdue);
    if (!pick || of_group[*pick]) return;  // the turn ends, or a lane of the group goes next
    const int32_t id = lane_of[*pick];
    const Lane& lane = lanes_[id];
    const size_t chunk_rows = candidates[*pick].next_rows;
    // The lanes that wait for the turn to go on: the decoding ones and the other prefills.
    const size_t waiting = decoding + candidates.size() - 1;
    if (rows + chunk_rows > n_ubatch ||
        (options_.chunks_together != ChunksTogether::kAll &&
         !JoinsChunkGroup(first_tokens, rows, chunk_rows, waiting, costs))) {
      return;
    }
    turn.Ran(static_cast<size_t>(id), candidates[*pick]);
    const size_t end = PlanChunk(id);  // cut only once it joins (never longer than judged)
    group.push_back({id, end});
    rows += end - lane.pos;
  }
}

std::vector<int32_t> Scheduler::PrefillChunks(std::span<const PlannedChunk> group, std::span<const int32_t> decoding) {
  std::vector<runtime::Engine::ChunkIn> chunks;
  size_t rows = 0;
  bool ends_a_prompt = false;
  for (const PlannedChunk& c : group) {
    const Lane& lane = lanes_[c.lane];
    const std::vector<Token>& prompt = lane.job->prompt().tokens;
    chunks.push_back({c.lane, std::span(prompt.data() + lane.pos, c.end - lane.pos), static_cast<int32_t>(lane.pos),
                      c.end == prompt.size()});
    rows += c.end - lane.pos;
    ends_a_prompt = ends_a_prompt || c.end == prompt.size();
  }
  // Decoding lanes beside them as beside one chunk: where the ubatch has room and no first token
  // would wait for their rows.
  const size_t n_ubatch = engine_->context().options().n_ubatch;
  const size_t room = !ends_a_prompt && n_ubatch > rows ? n_ubatch - rows : 0;
  std::vector<int32_t> stepping;
  std::vector<runtime::Engine::DecodeStepIn> steps = StepsOf(decoding.first(std::min(room, decoding.size())), stepping);
  const Clock::time_point start = Clock::now();
  auto r = engine_->DecodeStepWithChunks(steps, chunks);
  if (!r.ok() && (absl::IsInvalidArgument(r.status()) || absl::IsFailedPrecondition(r.status()))) {
    // Refused before llama.cpp saw it (nothing decoded): each chunk alone, so that one lane's bad
    // chunk fails that lane only; the decoding lanes step in the turn's closing step.
    for (const PlannedChunk& c : group) PrefillChunk(c.lane, {}, c.end);
    return {};
  }
  if (!r.ok()) {
    for (const PlannedChunk& c : group) FinishLane(c.lane, "", FromStatus(r.status()));
    AfterSteps(stepping, r.status());
    return stepping;
  }
  chunk_groups_.fetch_add(1);
  if (!steps.empty()) steps_with_chunk_.fetch_add(1);
  prefill_row_cost_.Add(MsBetween(start, Clock::now()), static_cast<double>(rows + steps.size()));
  prefill_row_ms_.store(prefill_row_cost_.per_unit());
  // First tokens before the records of the others (a record may export the lane's state).
  for (bool ending : {true, false}) {
    for (size_t i = 0; i < group.size(); ++i) {
      if (chunks[i].logits == ending) AfterChunk(group[i].lane, group[i].end, std::move(r->chunks[i]));
    }
  }
  if (!steps.empty()) AfterSteps(stepping, std::move(r->steps));
  return stepping;
}

std::vector<int32_t> Scheduler::PrefillChunk(int32_t id, std::span<const int32_t> decoding, size_t planned_end) {
  Lane& lane = lanes_[id];
  Job& job = *lane.job;
  const std::vector<Token>& prompt = job.prompt().tokens;
  const size_t end = planned_end > lane.pos ? planned_end : PlanChunk(id);
  const std::span<const Token> chunk(prompt.data() + lane.pos, end - lane.pos);
  // As many decoding lanes as the ubatch has room for beside the chunk (the chunk is not cut for
  // them: its rest would wait a turn, and with it a first token), and only beside a chunk that
  // does not end its prompt: a first token due at the chunk's end would wait for their rows.
  const size_t n_ubatch = engine_->context().options().n_ubatch;
  const size_t room = end < prompt.size() && n_ubatch > chunk.size() ? n_ubatch - chunk.size() : 0;
  std::vector<int32_t> stepping;
  std::vector<runtime::Engine::DecodeStepIn> steps = StepsOf(decoding.first(std::min(room, decoding.size())), stepping);
  std::optional<StatusOr<std::vector<std::vector<float>>>> step_logits;  // set when lanes stepped beside
  std::vector<float> logits;
  const Clock::time_point chunk_start = Clock::now();
  if (!steps.empty()) {
    // Never the prompt's last chunk (room is 0 there), so no logits of its own.
    const runtime::Engine::ChunkIn in{id, chunk, static_cast<int32_t>(lane.pos), false};
    auto r = engine_->DecodeStepWithChunks(steps, std::span(&in, 1));
    if (!r.ok()) {
      FinishLane(id, "", FromStatus(r.status()));
      AfterSteps(stepping, r.status());
      return stepping;
    }
    steps_with_chunk_.fetch_add(1);
    step_logits = std::move(r->steps);
  } else if (end == prompt.size()) {
    auto last = engine_->Decode(id, chunk, static_cast<int32_t>(lane.pos));
    if (!last.ok()) {
      FinishLane(id, "", FromStatus(last.status()));
      return {};
    }
    logits = std::move(*last);
  } else if (absl::Status s = engine_->Prefill(id, chunk, static_cast<int32_t>(lane.pos)); !s.ok()) {
    // Only the last chunk's logits are read: the others skip the output projection.
    FinishLane(id, "", FromStatus(s));
    return {};
  }
  // A step beside the chunk counts its decode rows as prompt rows: each costs about as much there.
  prefill_row_cost_.Add(MsBetween(chunk_start, Clock::now()), static_cast<double>(chunk.size() + steps.size()));
  prefill_row_ms_.store(prefill_row_cost_.per_unit());
  AfterChunk(id, end, std::move(logits));
  if (step_logits) AfterSteps(stepping, std::move(*step_logits));
  return stepping;
}

void Scheduler::AfterChunk(int32_t id, size_t end, std::vector<float> logits) {
  Lane& lane = lanes_[id];
  const size_t prompt_size = lane.job->prompt().tokens.size();
  lane.pos = end;
  ++lane.next_chunk;
  if (end < prompt_size) {
    const Clock::time_point record_start = Clock::now();
    cache_->AtBoundary(id, end);  // the records planned there, if any
    lane.timings.record_ms += MsBetween(record_start, Clock::now());
  }
  if (lane.pos == prompt_size) {
    lane.logits = std::move(logits);
    lane.prefill_done = Clock::now();
    lane.phase = Phase::kGenerate;
    EmitToken(id);
  }
}

void Scheduler::EmitToken(int32_t id) {
  Lane& lane = lanes_[id];
  Job& job = *lane.job;
  if (lane.generated >= job.max_tokens()) {
    cache_->AfterFirstToken(id, lane.logits);
    FinishLane(id, "length", std::nullopt);
    return;
  }
  const Clock::time_point sample_start = Clock::now();
  StatusOr<Token> sampled = lane.sampler->Sample(lane.logits);
  if (const double ms = MsBetween(sample_start, Clock::now());
      sampled.ok() && ms > kMaxGrammarSampleMs && !job.request().sampling.grammar.empty()) {
    // A grammar's work per token can grow with every token (ambiguous rules multiply its stacks),
    // and it runs on the engine thread every lane waits for: the request ends at the first token
    // past the bound, which is at most about twice the bound's worth of stalled steps.
    sampled = absl::InvalidArgumentError(StrCat("the grammar took ", static_cast<int64_t>(ms),
                                                " ms to sample one token, more than ", kMaxGrammarSampleMs,
                                                " ms: simplify it"));
  }
  if (!sampled.ok()) {
    // No token to give (the grammar allows none, every token was banned), or a grammar too dear:
    // the request ends with the reason (a stream has had the text so far).
    cache_->AfterFirstToken(id, lane.logits);
    FinishLane(id, "", FromStatus(sampled.status()));
    return;
  }
  const Token tok = *sampled;
  if (lane.generated == 0) {
    lane.first_token = Clock::now();
    lane.timings.ttft_ms = MsBetween(job.arrival(), lane.first_token);
    metrics_.ObserveTtft(lane.timings.ttft_ms / 1000.0);
  }
  if (!job.request().ignore_eos && runtime::IsEndOfGeneration(engine_->model(), tok)) {
    cache_->AfterFirstToken(id, lane.logits);
    FinishLane(id, "stop", std::nullopt);
    return;
  }
  // A tool call's markers are special tokens the reply parser reads as text (preserved tokens).
  const std::optional<runtime::ToolCalling>& calling = job.prompt().tool_calling;
  const bool special = calling && std::find(calling->preserved_tokens.begin(), calling->preserved_tokens.end(), tok) !=
                                      calling->preserved_tokens.end();
  auto piece = runtime::TokenPiece(engine_->model(), tok, special);
  bool stop_hit = false;
  std::optional<TokenLogprobs> logprobs;
  if (job.request().n_probs > 0) logprobs = Logprobs(engine_->model(), lane.logits, tok, job.request().n_probs);
  job.Append(tok, piece.ok() ? *piece : std::string(), &stop_hit, std::move(logprobs));
  ++lane.generated;
  // The client has its first token; the lane still holds exactly the prompt. Its records are made
  // now, off the time to first token (later calls do nothing).
  cache_->AfterFirstToken(id, lane.logits);
  if (stop_hit) {
    FinishLane(id, "stop", std::nullopt);
    return;
  }
  if (lane.generated >= job.max_tokens() || lane.pos + 1 > options_.ctx_per_lane) {
    FinishLane(id, "length", std::nullopt);
    return;
  }
  lane.next_token = tok;
}

void Scheduler::Generate(int32_t id) {
  Lane& lane = lanes_[id];
  const Clock::time_point step_start = Clock::now();
  auto logits = engine_->Decode(id, std::span(&lane.next_token, 1), static_cast<int32_t>(lane.pos));
  decode_lane_cost_.Add(MsBetween(step_start, Clock::now()), 1);
  decode_lane_ms_.store(decode_lane_cost_.per_unit());
  if (!logits.ok()) {
    FinishLane(id, "", FromStatus(logits.status()));
    return;
  }
  lane.logits = std::move(*logits);
  lane.decoded.push_back(lane.next_token);
  ++lane.pos;
  EmitToken(id);
}

std::vector<runtime::Engine::DecodeStepIn> Scheduler::StepsOf(std::span<const int32_t> ids, std::vector<int32_t>& stepping) {
  std::vector<runtime::Engine::DecodeStepIn> steps;
  for (int32_t id : ids) {
    if (FinishIfCancelled(id)) continue;
    const Lane& lane = lanes_[id];
    steps.push_back({id, lane.next_token, static_cast<int32_t>(lane.pos)});
    stepping.push_back(id);
  }
  return steps;
}

void Scheduler::AfterSteps(std::span<const int32_t> stepping, StatusOr<std::vector<std::vector<float>>> logits) {
  for (size_t i = 0; i < stepping.size(); ++i) {
    Lane& lane = lanes_[stepping[i]];
    if (!logits.ok()) {
      FinishLane(stepping[i], "", FromStatus(logits.status()));
      continue;
    }
    lane.logits = std::move((*logits)[i]);
    lane.decoded.push_back(lane.next_token);
    ++lane.pos;
    EmitToken(stepping[i]);
  }
}

void Scheduler::GenerateTogether(std::span<const int32_t> ids) {
  std::vector<int32_t> stepping;
  const std::vector<runtime::Engine::DecodeStepIn> steps = StepsOf(ids, stepping);
  if (steps.empty()) return;
  const auto [lo, hi] = std::minmax_element(stepping.begin(), stepping.end());
  const bool apart = static_cast<size_t>(*hi - *lo) + 1 != stepping.size();
  if (apart && !ragged_steps_) {
    // A lane left the group (its client went away): the engine would step the lanes left in one
    // ragged graph, which this server has not checked or was told not to use; step each run.
    for (const std::vector<int32_t>& run : DecodeGroups(stepping, {}, /*ragged=*/false)) GenerateTogether(run);
    return;
  }
  const Clock::time_point step_start = Clock::now();
  auto logits = engine_->DecodeStep(steps);
  decode_lane_cost_.Add(MsBetween(step_start, Clock::now()), static_cast<double>(steps.size()));
  decode_lane_ms_.store(decode_lane_cost_.per_unit());
  if (logits.ok() && steps.size() >= 2) {
    steps_together_.fetch_add(1);
    if (apart) ragged_steps_count_.fetch_add(1);
  }
  AfterSteps(stepping, std::move(logits));
}

lane_cache::NextTurnFn Scheduler::NextTurn(const Lane& lane, bool completed) const {
  if (!completed || options_.answer_prefill_idle_ms < 0) return nullptr;
  const GenerationRequest& r = lane.job->request();
  if (r.messages.empty() && !r.prompt_text) return nullptr;  // token ids: the client sends tokens back
  // With tools the next request renders them and, after a call, goes on with its result, not a
  // user message: not the turn NextTurnPrefix predicts.
  if (!r.tools.tools.empty()) return nullptr;
  return [&model = engine_->model(), messages = r.messages, prompt = r.prompt_text.value_or(""),
          text = lane.job->text()]() -> std::optional<std::vector<Token>> {
    // The reply as the client got it: the response's JSON replaces invalid UTF-8.
    const std::string reply = nlohmann::json::parse(Dump(nlohmann::json(text))).get<std::string>();
    StatusOr<std::vector<Token>> next =
        messages.empty() ? runtime::NextTextPrefix(model, prompt + reply) : runtime::NextTurnPrefix(model, messages, reply);
    if (!next.ok()) return std::nullopt;
    return *std::move(next);
  };
}

void Scheduler::FinishLane(int32_t id, std::string reason, std::optional<ApiError> error) {
  Lane& lane = lanes_[id];
  // The lane keeps its prompt (and, where decode rows are in the prompt rows' class, the tokens
  // generated into it) for the next request when it was fully computed, or is cleared.
  const size_t n = lane.job ? lane.job->prompt().tokens.size() : 0;
  const bool completed = !error && n > 0 && lane.pos >= n;
  cache_->Finish(id, completed, lane.decoded, NextTurn(lane, completed));
  const Clock::time_point now = Clock::now();
  if (lane.prefill_done != Clock::time_point{}) {
    lane.timings.prompt_ms = MsBetween(lane.started, lane.prefill_done);
    lane.timings.predicted_ms = MsBetween(lane.prefill_done, now);
  } else if (lane.started != Clock::time_point{}) {
    lane.timings.prompt_ms = MsBetween(lane.started, now);
  }
  lane.timings.predicted_n = static_cast<size_t>(lane.generated);
  metrics_.AddGenerated(static_cast<uint64_t>(lane.generated));
  // The lane is free before the handler wakes up, so a client that sees the response never sees
  // its lane still busy.
  std::shared_ptr<Job> job = std::move(lane.job);
  const JobTimings timings = lane.timings;
  lane = Lane{};
  idle_since_ = Clock::now();
  {
    std::lock_guard lock(mu_);
    --busy_;
  }
  job->Finish(std::move(reason), std::move(error), timings);
  // The exchange the lane keeps is recorded once the response is on its way (LaneCache::Finish).
  cache_->RecordExchanges();
}

}  // namespace skippy::server
