// Scheduler: owns the Engine on one engine thread and runs requests on its lanes.
//
// Threads. HTTP handler threads build a Job (parsed, tokenized, validated) and Submit it; the
// engine thread is the only thread that touches the Engine and the LaneCache. A step is one
// prefill chunk or one generated token of a lane; a new job starts with its restore, and its
// first chunk is all of the prompt that a hit leaves, as a rule. A token is sampled and streamed
// as soon as its logits exist (the first one right after the last prefill chunk) and decoded at
// the lane's next step, so a first token does not wait for the other lanes once its prefill is
// done. A prefill chunk never holds another lane's prompt rows (with --mixed-steps on, other
// lanes' decode rows may share its llama_decode, and with --chunks-together other lanes' chunks,
// below).
//
// The one-row class (--one-row-class=auto, the default: DecideOneRowClass keeps it where a lone
// decode step measured at load costs at most kLoneStepTolerance more in it, kLaneStepTolerance
// where lanes may step together; on; off) computes a
// decode row in the class of prompt rows: a lane keeps the tokens it generated as prompt KV, and
// lanes can step together with one row each.
//
// One lane at a time (--lane-batching=off; one lane; auto without the one-row class; recurrent and
// hybrid models without it): the engine thread
// admits queued jobs into free lanes at the start of each round and after each lane's step within
// it (a job that finds a free lane starts after the step in progress), and round-robins the busy
// lanes one step at a time, a new job's restore and first chunk being one step. The price of a
// quick start is paid by lanes already decoding: a job that starts between two of their tokens
// puts its restore and first chunk there.
//
// Lanes together (--lane-batching=auto, the default, with the one-row class on; --lane-batching=on
// with it or without; either way only when the model and build pass certify::CheckLaneBatching):
// the generated tokens of the decoding lanes go into
// llama_decode calls of several lanes (Engine::DecodeStep: one row per lane in the one-row class,
// a token and a pad row per lane without it), in the groups that the steps measured at load make
// cheapest (DecodeGroups). Lanes whose ids do not follow each other (0, 2, 3) share a group where
// the engine can step them in one graph (ragged steps, --ragged-steps on, the default: the one-row
// class, the patch series' ragged split, an attention-only or hybrid model; the check on lanes 0 and 2
// passes); elsewhere each run of consecutive ids is grouped apart (llama.cpp's stock split makes a
// graph per run: each reads every weight).
// Each turn of the engine thread admits queued jobs and restores them, runs prefill chunks up to
// one chunk's worth of rows (--prefill-chunk; at least one chunk, the lanes with the fewest rows
// left first, a lane's next chunk in the same turn only when its whole prefill fits: PrefillTurn;
// a job that arrives meanwhile is admitted, restored and ordered among them after each chunk),
// then steps every decoding lane once: between two decode steps there is about one chunk of
// prefill (plus the turn's restores, cache clears and record exports), as in chunked-prefill
// schedulers with a token budget. With mixed steps (--mixed-steps on, where the engine can: the
// one-row class, the patch series' ragged split, an attention-only model; and the startup check
// passes) a decoding lane steps in the first of the turn's chunks that does not end its
// prompt and has room for it in its ubatch, in that chunk's llama_decode
// (Engine::DecodeStepWithChunks: one graph, each lane's rows computed as alone), and the turn's
// closing decode step takes only the lanes that have not stepped; a step and a chunk then read the
// weights once. A chunk that ends its prompt carries no decode rows (its first token would wait
// for them), and no chunk is cut to make room (its rest would wait a turn). Hybrids step apart
// from chunks. With chunks together (--chunks-together on|all, the same engines and check), the
// chunks the turn runs next join the first one's llama_decode while JoinsChunkGroup says so (on)
// or while they fit a ubatch (all); decoding lanes ride along as beside one chunk.
// Jobs that arrive together then get their first tokens one turn apart, so their lanes finish
// and their clients come back apart too; prefilling them all before the next decode step kept a
// burst of clients in lockstep, every one waiting for the others' prefills at every request.
//
// SLOs. With --ttft-slo-ms and lanes together, a prefill that can no longer meet its first-token
// target goes after those that still can (prefill_order.h). With --tpot-slo-ms, either way, a
// prefill that runs while lanes decode is cut into pieces that keep each decoding lane's mean time
// per output token within the target (step_budget.h), at costs the engine thread measures as it
// runs; a planned batch is cut only where both pieces keep their batch class (LaneCache::CutBatch).
//
// Either way a lane's numbers do not depend on what else runs.
//
// Shared prefill. Either way, a job about to begin waits in its lane while another lane's
// prefill computes a prefix they share (SharedPrefillToWaitFor: only where that lowers the two
// jobs' summed times to first token), and begins once that lane's first token is out, restoring the
// prefix it recorded (an exact-boundary family records where the shared prefix ends:
// LaneCache::RecordAlso). So a burst that shares a system prompt or a document prefills it once.
//
// Idle work. Once no job has run or waited for answer_prefill_idle_ms, the engine thread runs the
// lane cache's idle work one batch at a time (LaneCache::IdleStep: a finished job's answer
// prefilled as prompt rows), checking for new jobs between batches, so a job that arrives then
// waits for one batch of answer_prefill_rows rows at most.
//
// Bounds. At most lane_count jobs run and queue_size wait; Submit refuses more with
// ResourceExhausted (the HTTP layer answers 503 with Retry-After).
//
// Job lifecycle. The handler thread waits on the Job (Wait/WaitFor); the engine thread appends
// tokens and text, then marks it done (with an error or a finish reason). Cancel() (a client that
// went away) is honoured at the next step: the lane is cleared and freed. Whatever happens to a
// job, its lane is cleared before the next job gets it and the cache stays consistent (records
// are committed or aborted within one step).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "skippy/certify/lane_batching.h"
#include "skippy/lane_cache/engine_backend.h"
#include "skippy/lane_cache/lane_cache.h"
#include "skippy/runtime/engine.h"
#include "skippy/server/api_error.h"
#include "skippy/server/cache_events.h"
#include "skippy/server/job.h"
#include "skippy/server/metrics.h"
#include "skippy/server/prefill_order.h"
#include "skippy/server/request.h"
#include "skippy/server/server_options.h"
#include "skippy/server/step_budget.h"

namespace skippy::server {

// The longest one token's sampling may take with a grammar before its request is ended (an
// InvalidArgument): the engine thread samples for every lane.
inline constexpr double kMaxGrammarSampleMs = 1000;

class Scheduler {
 public:
  Scheduler(ServerOptions options, Metrics& metrics);
  ~Scheduler();

  // Opens the model and context and starts the engine thread. Called once (from a loader thread).
  [[nodiscard]] Status Load();
  bool ready() const { return ready_; }
  // Valid once ready().
  const runtime::Model& model() const { return engine_->model(); }
  const std::string& model_name() const { return model_name_; }
  // Whether hits are served: the --no-cache choice and the startup checks together.
  bool cache_serving() const;
  const ServerOptions& options() const { return options_; }
  // Per-request context: the longest prompt + generation a lane may hold.
  uint32_t lane_context() const { return options_.ctx_per_lane; }

  // Unavailable while loading; ResourceExhausted when every lane is busy and the queue is full.
  [[nodiscard]] Status Submit(std::shared_ptr<Job> job);

  // Runs on the engine thread between steps and waits for it.
  StatusOr<size_t> ClearCache(const std::optional<std::string>& tenant_namespace);
  nlohmann::json CacheStats() const;
  Gauges gauges() const;
  // What the cache holds, as it changes (GET /cache/events).
  CacheEventLog& events() { return events_; }

  void Stop();

 private:
  enum class Phase { kStart, kPrefill, kGenerate };
  struct Lane {
    std::shared_ptr<Job> job;
    Phase phase = Phase::kStart;
    std::vector<size_t> chunk_ends;  // the prefill plan (lane_cache::JobStart)
    size_t next_chunk = 0;
    size_t pos = 0;  // tokens in the lane
    std::vector<float> logits;
    std::unique_ptr<runtime::Sampler> sampler;
    JobTimings timings;
    Clock::time_point started;
    Clock::time_point prefill_done;
    int64_t generated = 0;
    runtime::Token next_token = 0;  // streamed, decoded at the next step (Phase::kGenerate)
    std::vector<runtime::Token> decoded;  // generated tokens decoded into the lane, in order
    uint64_t admitted = 0;   // admission order (PrefillCandidate)
    Clock::time_point waiting_since;  // when it began to wait for a shared prefill (zero: never)
    size_t passed_over = 0;  // chunks given to other lanes since this lane's last (PrefillCandidate)
    Clock::time_point first_token;  // when the first token was streamed (the --tpot-slo-ms clock)
  };

  // For --one-row-class=auto: measures a lone decode step with the one-row class and without
  // (MeasureLoneStep; with one lane at kShortContext tokens too) and keeps the class on only when it
  // costs at most OneRowClassTolerance() (with one lane, at both); with a
  // disk tier, takes the decision an earlier start kept there instead (class_decision.h). Runs
  // right after the engine opens, before anything reads the classes. Sets one_row_class_json_.
  void DecideOneRowClass();
  // Whether generated tokens of all lanes go into one DecodeStep (sets lane_batching_).
  void DecideLaneBatching();
  // Whether a step of lanes whose ids do not follow each other is one graph (sets ragged_steps_):
  // with lanes together, three or more lanes, --ragged-steps on, an engine that can
  // (Engine::CanStepLanesApart) and certify::CheckLaneBatching passing on lanes 0 and 2 (a ragged
  // step; its report goes to lane_batching_json_["ragged_steps"]["check"]).
  void DecideRaggedSteps();
  // Whether decoding lanes step in a prompt chunk's llama_decode (sets mixed_steps_): with lanes
  // together, --mixed-steps on, an engine that can (Engine::CanStepWithChunk) and the startup
  // check passing (certify::CheckStepWithChunk).
  void DecideMixedSteps();
  // Whether several lanes' chunks of a turn go into one llama_decode (sets chunks_together_): with
  // lanes together, --chunks-together on or all, an engine that can (Engine::CanStepWithChunk) and
  // the startup check's two-chunk case passing too (certify::CheckStepWithChunk, run once for both).
  void DecideChunksTogether();
  // Why decode rows beside a chunk (mixed steps) or several lanes' chunks (`chunks_together`)
  // cannot go into one graph ("" when they can): `off` when not `asked` for, else what the engine
  // or the startup check says; fills `json`'s "on", "reason" and "check", and says why on stderr
  // (`apart`: what happens instead).
  std::string WhyNoStepsWithChunks(bool asked, std::string_view off, std::string_view apart, bool chunks_together,
                                   nlohmann::json& json);
  // The startup check of steps with chunks (run on the first call only): "" when its cases for
  // mixed steps pass, and with `chunks_together` its case of two lanes' chunks too; else why not.
  std::string WhyStepsWithChunksFail(bool chunks_together);
  // Why lanes cannot step together in the batch classes now in force ("" when they can): too many
  // rows for a ubatch, recurrent state with pad rows, or certify::CheckLaneBatching failing (its
  // report goes to lane_batching_json_["check"]).
  std::string WhyLanesCannotStepTogether();
  // Rows of one step of every lane, `rows_per_lane` each (checked against the ubatch).
  uint32_t StepOfAllLanesRows(size_t rows_per_lane) const;
  // For a learned family (an architecture outside the family table): runs the certifier
  // (certify::RunStateHandoff) on the model with the server's settings and enables the family on
  // the engine when it passes. Sets learned_json_; returns "" or why the cache stays off.
  std::string CertifyLearnedFamily();
  void Loop();
  // With lane_batching_: restores every admitted job, runs the turn's prefill chunks (PrefillTurn
  // within prefill_chunk rows, a lane overdue after 2 * lane_count chunks of others; jobs admitted
  // after each chunk join), then one token for every decoding lane in DecodeGroups (lanes apart
  // in one group with ragged_steps_).
  void StepTogether();
  // Begins (StartJob) the lanes admitted and not begun, in admission order, except those that
  // wait for a shared prefill or whose client went away.
  void StartAdmitted();
  // Moves queued jobs (skipping cancelled ones) into free lanes; returns those lanes. Holds mu_.
  std::vector<int32_t> AdmitLocked();
  // Finishes (499) and removes every queued job whose client went away. Holds mu_.
  void DropCancelledLocked();
  void Step(int32_t lane_id);
  // Frees the lane with a 499 when its client went away; returns whether it did.
  bool FinishIfCancelled(int32_t lane_id);
  // Whether the lane's job, not begun, waits for another lane's prefill of a prefix they share
  // (SharedPrefillToWaitFor, with the cache serving); counts the job's first wait.
  bool WaitsForSharedPrefill(int32_t lane_id);
  void StartJob(int32_t lane_id);
  // The rows a prefill may run now so that no decoding lane it can keep on time misses
  // --tpot-slo-ms (PrefillRowsWithinTpot at the costs measured so far), at least
  // kMinPrefillPiece; SIZE_MAX when nothing bounds it, or when `lane`'s prompt would miss
  // --ttft-slo-ms in pieces and not whole (TtftOutranksTpot).
  size_t PrefillRowsNow(const Lane* lane = nullptr) const;
  // The lane as a prefill candidate (PrefillTurn) with `pos` tokens in it and chunk `next_chunk`
  // next (its own, or as it will be after a chunk of a group that has not run yet).
  PrefillCandidate CandidateOf(const Lane& lane, size_t pos, size_t next_chunk, Clock::time_point now) const;
  // What is left of the lane's --ttft-slo-ms at `now` (below 0: past it).
  double TtftLeftMs(const Lane& lane, Clock::time_point now) const;
  // The lane's next planned batch, first cut to PrefillRowsNow() where it is longer
  // (LaneCache::CutBatch). With `decoding` (lanes in Phase::kGenerate, mixed steps on) and a
  // batch that does not end the prompt, the tokens of as many of them as the ubatch has room for
  // beside it go into its llama_decode (Engine::DecodeStepWithChunks); returns the lanes that
  // stepped so (emitted, finished or failed like GenerateTogether's).
  // `planned_end`: the chunk's end as PlanChunk already planned it (0: plan it now).
  std::vector<int32_t> PrefillChunk(int32_t lane_id, std::span<const int32_t> decoding = {}, size_t planned_end = 0);
  // The lane's next chunk end, its planned batch first cut to PrefillRowsNow() where it is longer
  // (LaneCache::CutBatch, which rewrites the lane's chunk_ends) and cuts are proven exact.
  size_t PlanChunk(int32_t lane_id);
  struct PlannedChunk {
    int32_t lane = 0;
    size_t end = 0;  // PlanChunk's
  };
  // With chunks_together_: plans group[0] (Ran already) and adds the chunks the turn would run
  // next, each planned and Ran as it joins, while they fit a ubatch and, with --chunks-together on,
  // JoinsChunkGroup says so; stops where the turn's next chunk is a lane's of the group.
  void GrowChunkGroup(PrefillTurn& turn, std::vector<PlannedChunk>& group, size_t overdue);
  // The planned chunks of 2+ lanes in one Engine::DecodeStepWithChunks, with decoding lanes beside
  // them as PrefillChunk puts them (mixed steps, no chunk ending its prompt); returns the lanes that
  // stepped so. A group the engine refuses before decoding runs chunk by chunk.
  std::vector<int32_t> PrefillChunks(std::span<const PlannedChunk> group, std::span<const int32_t> decoding);
  // After the lane's chunk up to `end` ran: the lane's position, its records there, and its first
  // token when the chunk ended the prompt (`logits`: that chunk's last row).
  void AfterChunk(int32_t lane_id, size_t end, std::vector<float> logits);
  // Decodes the lane's next_token and emits the token after it.
  void Generate(int32_t lane_id);
  // Generate for every lane in `lane_ids` (all in Phase::kGenerate) with one Engine::DecodeStep (a
  // group of DecodeGroups).
  void GenerateTogether(std::span<const int32_t> lane_ids);
  // The step of each lane in `lane_ids` that is still there (a lane whose client went away is
  // freed), its id appended to `stepping`.
  std::vector<runtime::Engine::DecodeStepIn> StepsOf(std::span<const int32_t> lane_ids, std::vector<int32_t>& stepping);
  // Takes each stepping lane's logits (in order) and emits its token, or finishes every one of
  // them with the error.
  void AfterSteps(std::span<const int32_t> stepping, StatusOr<std::vector<std::vector<float>>> logits);
  // Runs when the lane's logits are new (last prefill chunk, decoded-result hit, decode): samples,
  // streams the token, finishes the lane when it is done, else keeps the token as next_token.
  void EmitToken(int32_t lane_id);
  void FinishLane(int32_t lane_id, std::string reason, std::optional<ApiError> error);
  // For a completed job's answer prefill: its next turn's start as the client will send it, for
  // a chat (runtime::NextTurnPrefix) or a text prompt (runtime::NextTextPrefix), worked out when
  // the lane cache asks; null for a prompt of token ids (and for a job the lane does not keep, so
  // nothing is copied for it).
  lane_cache::NextTurnFn NextTurn(const Lane& lane, bool completed) const;

  ServerOptions options_;
  Metrics& metrics_;
  // The cache dir's lock, from the start of Load with a --cache-dir (the cache on or off): the
  // class decision and the disk tier are read and written under it.
  std::shared_ptr<const cache::CacheDirLock> cache_dir_lock_;
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<lane_cache::EngineBackend> backend_;
  std::unique_ptr<lane_cache::LaneCache> cache_;
  CacheEventLog events_;
  nlohmann::json batch_split_json_;  // the startup check's report (null when it did not run)
  // Why --tpot-slo-ms cuts no prefill batch (the startup check failed on this model); "" when it
  // may. Set once before serving.
  std::string slo_cuts_off_;
  nlohmann::json cut_cost_json_;     // lane_cache::MeasureCutCost's (null when it did not run)
  nlohmann::json learned_json_;      // CertifyLearnedFamily's summary (null for a table family)
  std::string model_name_;
  std::atomic<bool> ready_{false};
  bool lane_batching_ = false;    // generated tokens of all lanes in one DecodeStep (see above)
  nlohmann::json one_row_class_json_;  // the class and why (CacheStats "one_row_class"); set by Load
  nlohmann::json lane_batching_json_;  // why (CacheStats "lane_batching"); set by Load
  std::atomic<uint64_t> steps_together_{0};  // DecodeStep calls that stepped 2+ lanes
  bool ragged_steps_ = false;  // lanes apart step in one graph (DecodeGroups' `ragged`; see above)
  std::atomic<uint64_t> ragged_steps_count_{0};  // DecodeStep calls of lanes apart (one ragged graph each)
  bool mixed_steps_ = false;  // decoding lanes step beside prompt chunks (see above)
  nlohmann::json mixed_steps_json_;  // why (CacheStats "mixed_steps"); set by Load
  std::atomic<uint64_t> steps_with_chunk_{0};  // DecodeStepWithChunks calls with decode rows
  bool chunks_together_ = false;  // several lanes' chunks in one graph (see above)
  nlohmann::json chunks_together_json_;  // why (CacheStats "chunks_together"); set by Load
  std::atomic<uint64_t> chunk_groups_{0};  // DecodeStepWithChunks calls with 2+ chunks
  std::optional<StatusOr<certify::StepWithChunkReport>> steps_with_chunks_check_;  // once run
  nlohmann::json steps_with_chunks_check_json_;  // its report
  std::atomic<uint64_t> shared_prefill_waits_{0};  // jobs that waited for another lane's prefill
  // A job waits for another lane's prefill only when that saves it at least this many tokens.
  static constexpr size_t kMinSharedPrefill = 64;
  // --one-row-class=auto keeps the class when a lone decode step in it takes at
  // most this many times the default one (the median ratio of back-to-back pairs at startup). 3%
  // is the parity bar Skippy holds its decode to against llama-server's. The ratios measured per
  // model and CPU run from 0.58 to 1.34 (docs/evidence/lane-batching-auto/); a model within about
  // 3% of the tolerance (Gemma3 Q4_K_M and DeepSeek2 F16 there) can decide either way from one
  // start to the next.
  static constexpr double kLoneStepTolerance = 1.03;
  // With one lane the class is also measured at this short context and held to kLoneStepTolerance
  // there too: at 512 tokens its tiled attention can make up for dearer products that a short
  // conversation pays in full (DeepSeek2 and Falcon-H1 F16: 1.01x and 0.88x at 512 tokens, 4-5%
  // slower decode than without the class at 20-word prompts; docs/evidence/parity/).
  static constexpr size_t kShortContext = 32;
  // Where lanes may step together (2+ lanes, --lane-batching not off, a row of each in a ubatch),
  // the class also turns a round of k busy lanes from k lone steps into steps of several lanes
  // (DecodeGroups), which decode k rows for little more than one row's weight reads, so auto keeps
  // it up to this ratio: what one lane busy alone may pay per token for throughput under load. On
  // Qwen3Next IQ2_XS (lone-step ratio 1.00-1.07) lanes together gave 1.07x-1.63x the throughput of
  // lanes one at a time at two to eight clients (docs/evidence/concurrency-ref/lanes-class-tolerance/).
  // Near this tolerance now: Gemma3 and Qwen3Next F16 (1.10-1.13 in
  // docs/evidence/concurrency-f16/after-turn-rules/). Should the lane-batching check then fail
  // (it has not on any model so far), the lanes decode one at a time in a class kept at up to 10%.
  // Replicas on a shared tier agree per tolerance (it is in the agreement's name), so replicas
  // started with one lane and with several may run in different classes.
  static constexpr double kLaneStepTolerance = 1.10;
  // The tolerance --one-row-class=auto holds a lone step to on this server (above).
  double OneRowClassTolerance() const;
  std::vector<double> decode_step_ms_;  // MeasureDecodeSteps: how decoding lanes are grouped (DecodeGroups)
  // --tpot-slo-ms: what a prompt row of prefill and a decoding lane's step cost here (engine
  // thread), and the batches cut to keep it.
  CostEstimate prefill_row_cost_;
  CostEstimate decode_lane_cost_;
  std::atomic<uint64_t> batches_cut_{0};
  // The two costs as last measured, for CacheStats (any thread).
  std::atomic<double> prefill_row_ms_{0};
  std::atomic<double> decode_lane_ms_{0};
  // The smallest piece a bounded prefill runs per step, so that a prompt always advances. Not 64:
  // 64 rows of Llama F16 on the bench zoo (about 80 ms here) and a step of four lanes already
  // took more than a 100 ms target, so every lane counted as late and nothing was bounded.
  static constexpr size_t kMinPrefillPiece = 32;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  size_t busy_ ABSL_GUARDED_BY(mu_) = 0;  // lanes with a job
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  struct Control {
    std::optional<std::string> tenant_namespace;
    std::promise<size_t>* done;
  };
  std::deque<Control> controls_ ABSL_GUARDED_BY(mu_);
  std::vector<Lane> lanes_;  // engine thread only
  uint64_t admissions_ = 0;  // jobs admitted so far (engine thread only)
  Clock::time_point idle_since_;  // when a lane last finished (engine thread only)
  std::thread thread_;
};

}  // namespace skippy::server
