#include "skippy/server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "skippy/certify/lane_batching.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/sampler.h"

namespace skippy::server {

using runtime::Token;

namespace {

// The errors of a job the server does not finish: its client went away (queued or running), or
// the server is stopping.
ApiError ClientWentAway() { return {499, "invalid_request_error", "cancelled", "the client went away"}; }
ApiError ShuttingDown() { return {503, "server_error", "shutting_down", "the server is stopping"}; }

TokenLogprobs::Candidate MakeCandidate(const runtime::Model& model, Token id, double logprob) {
  auto piece = runtime::TokenPiece(model, id);
  return {id, piece.ok() ? *piece : std::string(), logprob};
}

// Log-softmax in double over the whole vocabulary, so equal logits give equal numbers.
TokenLogprobs Logprobs(const runtime::Model& model, const std::vector<float>& logits, Token chosen, int32_t n) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = static_cast<double>(max) + std::log(sum);
  std::vector<Token> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<Token>(i);
  const size_t top = std::min<size_t>(static_cast<size_t>(n), order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                    [&](Token a, Token b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  TokenLogprobs out;
  out.chosen = MakeCandidate(model, chosen, logits[chosen] - log_z);
  for (size_t i = 0; i < top; ++i) out.top.push_back(MakeCandidate(model, order[i], logits[order[i]] - log_z));
  return out;
}

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Job

Job::View Job::Snapshot() const { return view_; }

Job::View Job::WaitFor(size_t have_tokens, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return view_.done || view_.tokens.size() > have_tokens; });
  return Snapshot();
}

Job::View Job::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return view_.done; });
  return Snapshot();
}

void Job::Append(Token token, const std::string& piece, bool* stop_hit, std::optional<TokenLogprobs> logprobs) {
  std::lock_guard lock(mu_);
  view_.tokens.push_back(token);
  if (logprobs) view_.logprobs.push_back(*std::move(logprobs));
  const size_t old = view_.text.size();
  view_.text += piece;
  *stop_hit = false;
  for (const std::string& s : request_.stop) {
    const size_t from = old >= s.size() ? old - s.size() + 1 : 0;
    const size_t at = view_.text.find(s, from);
    if (at != std::string::npos) {
      view_.text.resize(at);
      *stop_hit = true;
      break;
    }
  }
  cv_.notify_all();
}

void Job::SetTimings(const JobTimings& t) {
  std::lock_guard lock(mu_);
  view_.timings = t;
}

void Job::Finish(std::string finish_reason, std::optional<ApiError> error, const JobTimings& timings) {
  std::lock_guard lock(mu_);
  view_.done = true;
  view_.finish_reason = std::move(finish_reason);
  view_.error = std::move(error);
  view_.timings = timings;
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(ServerOptions options, Metrics& metrics) : options_(std::move(options)), metrics_(metrics) {
  options_.lane_count = std::max<uint32_t>(1, options_.lane_count);
  // Every prefill batch keeps runtime::MinExactBatch rows, so a chunk holds at least two of them.
  const auto min_batch = static_cast<uint32_t>(runtime::MinExactBatch(options_.flash_attn, options_.min_exact_batch));
  options_.n_batch = std::max<uint32_t>(options_.n_batch, 2 * min_batch);
  options_.prefill_chunk = std::clamp<uint32_t>(options_.prefill_chunk, 2 * min_batch, options_.n_batch);
  // A tail record leaves at least one short batch (ServingCache::Plan makes it a long one after a
  // long message).
  if (options_.record_tail != 0) {
    options_.record_tail = std::max<uint32_t>(options_.record_tail, cache::BatchClasses::kMinShortBatch);
  }
  model_name_ = options_.model_alias.empty() ? std::filesystem::path(options_.model_path).stem().string()
                                             : options_.model_alias;
}

Scheduler::~Scheduler() { Stop(); }

Status Scheduler::Load() {
  runtime::EngineOptions eo;
  eo.model_path = options_.model_path;
  // The same context whether the cache is on or off (--no-cache must compute the same numbers).
  eo.context.n_batch = options_.n_batch;
  eo.context.n_ubatch = options_.n_batch;
  eo.context.n_threads = options_.threads;
  eo.context.flash_attn = options_.flash_attn;
  eo.min_exact_batch = options_.min_exact_batch;
  eo.lane_count = options_.lane_count;
  eo.context.kv_unified = options_.kv_unified;
  // A lane stepping with others writes a pad row after its last token (Engine::DecodeStep). llama.cpp
  // rounds a lane's cells up to a multiple of 256, so with -c a multiple of 256 this costs 256
  // cells per lane (also for recurrent models, which then decode one lane at a time: the model is
  // not known before the context is made).
  const uint32_t pad = options_.lane_count >= 2 && options_.lane_batching && !options_.kv_unified ? 1 : 0;
  if (options_.kv_unified) {
    // One stream: lanes * per-lane context + cells for resident cache entries. Sliding-window
    // models get a full-size SWA cache: resident entries recorded mid-prefill pin the window cells
    // they share with the lane, and the default SWA cache (window x sequences + one ubatch) runs out
    // of cells after a few of them (llama_decode then finds no slot).
    eo.context.n_ctx = (options_.ctx_per_lane + pad) * options_.lane_count + options_.cache_tokens;
    eo.context.swa_full = true;
    eo.cache_seq_count = std::max<uint32_t>(1, options_.cache_seqs);
  } else {
    // One stream per lane (llama.cpp gives each n_ctx / n_seq_max cells) and no cache sequences.
    // Sliding-window layers get the full per-lane size too, so a lane never overwrites its own
    // older cells within its context: its last prompt can be cut back to a shared prefix
    // (ServingCache::LaneReuse), and new cells always land in position order.
    eo.context.n_ctx = (options_.ctx_per_lane + pad) * options_.lane_count;
    eo.context.swa_full = true;
    eo.cache_seq_count = 0;
  }
  SKIPPY_ASSIGN_OR_RETURN(engine_, runtime::Engine::Open(eo));
  if (!engine_->family().enabled) {
    std::fprintf(stderr, "skippy-server: the cache is disabled for this model: %s\n", engine_->family().reason.c_str());
  }
  SKIPPY_ASSIGN_OR_RETURN(cache_, ServingCache::Create(options_, *engine_));
  std::string no_batching;
  if (options_.lane_count < 2) {
    no_batching = "one lane";
  } else if (!options_.lane_batching) {
    no_batching = "off (--lane-batching turns it on)";
  } else if (options_.kv_unified) {
    no_batching = "--kv-unified: the lanes share one KV stream, so their cells interleave with the traffic";
  } else if (2 * options_.lane_count > engine_->context().options().n_ubatch) {
    no_batching = StrCat("a step of ", options_.lane_count, " lanes needs ", 2 * options_.lane_count,
                         " rows, more than the batch of ", engine_->context().options().n_ubatch);
  } else if (!engine_->CanDecodeSteps()) {
    no_batching = "recurrent state cannot drop a pad row";
  } else if (auto check = certify::CheckLaneBatching(*engine_, 0, 1); !check.ok()) {
    no_batching = StrCat("the lane-batching check could not run: ", check.status().message());
  } else {
    lane_batching_json_["check"] = check->ToJson();
    if (!check->pass) no_batching = "the lane-batching check failed: a lane's logits depend on the lanes beside it";
  }
  lane_batching_ = no_batching.empty();
  lane_batching_json_["on"] = lane_batching_;
  if (!lane_batching_) {
    lane_batching_json_["reason"] = no_batching;
    if (options_.lane_count >= 2 && options_.lane_batching) {
      std::fprintf(stderr, "skippy-server: lanes decode one at a time: %s\n", no_batching.c_str());
    }
  }
  lanes_.resize(options_.lane_count);
  held_.resize(options_.lane_count);
  thread_ = std::thread([this] { Loop(); });
  ready_ = true;
  return absl::OkStatus();
}

Status Scheduler::Submit(std::shared_ptr<Job> job) {
  if (!ready_) return absl::UnavailableError("the model is loading");
  std::lock_guard lock(mu_);
  if (stop_) return absl::UnavailableError("the server is stopping");
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

nlohmann::json Scheduler::CacheStats() const {
  if (!ready_) return nlohmann::json::object();
  nlohmann::json j = cache_->StatsJson();
  j["lane_batching"] = lane_batching_json_;
  j["lane_batching"]["steps_together"] = steps_together_.load();
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
  if (ready_) cache_->FillGauges(g);
  return g;
}

void Scheduler::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  for (auto& job : queue_) job->Finish("", ShuttingDown(), {});
  queue_.clear();
  for (auto& c : controls_) c.done->set_value(0);
  controls_.clear();
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
      cv_.wait(lock, [&] {
        return stop_ || active || !controls_.empty() || (!queue_.empty() && busy_ < lanes_.size());
      });
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
    // One round: every busy lane steps once. A job that arrives during the round and finds a free
    // lane starts at once (its restore and first chunk, and its first token when that is all it
    // needs) instead of waiting for the round to end.
    std::vector<char> stepped(lanes_.size(), 0);
    std::vector<int32_t> decoding;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (!lanes_[i].job || stepped[i]) continue;
      if (lane_batching_ && lanes_[i].phase == Phase::kGenerate) {
        decoding.push_back(static_cast<int32_t>(i));
        continue;
      }
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
    if (!decoding.empty()) GenerateTogether(decoding);
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
      StartJob(id);
      // The restore and the first chunk are one step: a new job does not wait a round to start.
      if (lane.job && lane.phase == Phase::kPrefill) PrefillChunk(id);
      break;
    case Phase::kPrefill: PrefillChunk(id); break;
    case Phase::kGenerate: Generate(id); break;
  }
}

void Scheduler::StartJob(int32_t id) {
  Lane& lane = lanes_[id];
  Job& job = *lane.job;
  lane.started = Clock::now();
  lane.timings.queue_ms = MsBetween(job.arrival(), lane.started);
  const std::vector<Token>& prompt = job.prompt().tokens;

  runtime::SamplingParams sp = job.request().sampling;
  if (!job.request().seed_given) sp.seed = std::random_device{}();
  auto sampler = runtime::Sampler::Create(sp);
  if (!sampler.ok()) {
    FinishLane(id, "", FromStatus(sampler.status()));
    return;
  }
  lane.sampler = std::move(*sampler);

  lane.scope = cache_->Scope(job.tenant_namespace());
  lane.classes = cache_->Classes(prompt.size(), job.prompt().message_boundaries);
  size_t lane_tokens = 0, lane_prompt_tokens = 0;
  LaneMemory& held = held_[static_cast<size_t>(id)];
  if ((cache_->LaneReuse() || cache_->HybridLaneReuse()) && held.cache_namespace == lane.scope.cache_namespace) {
    const size_t limit = std::min(held.tokens.size(), prompt.size());
    while (lane_tokens < limit && held.tokens[lane_tokens] == prompt[lane_tokens]) ++lane_tokens;
    lane_prompt_tokens = held.tokens.size();
  }
  const cache::BatchClasses lane_classes = std::move(held.classes);
  held = LaneMemory{};  // the lane changes from here on
  const Clock::time_point restore_start = Clock::now();
  RestoreOutcome r =
      cache_->Restore(id, lane.scope, prompt, lane.classes, lane_tokens, lane_prompt_tokens, &lane_classes);
  lane.timings.restore_ms = MsBetween(restore_start, Clock::now());
  lane.plan = cache_->Plan(prompt, job.prompt().message_boundaries, lane.classes, r.restored, r.branch);
  lane.pos = r.restored;
  lane.timings.cache_n = r.restored;
  lane.timings.prompt_n = prompt.size() - r.restored;
  lane.timings.cache_payload = r.payload;
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
  while (lane.next_chunk < lane.plan.chunk_ends.size() && lane.plan.chunk_ends[lane.next_chunk] <= lane.pos) {
    ++lane.next_chunk;
  }
  lane.phase = Phase::kPrefill;
}

void Scheduler::PrefillChunk(int32_t id) {
  Lane& lane = lanes_[id];
  Job& job = *lane.job;
  const std::vector<Token>& prompt = job.prompt().tokens;
  const size_t end = lane.plan.chunk_ends[lane.next_chunk];
  const std::span<const Token> chunk(prompt.data() + lane.pos, end - lane.pos);
  if (end == prompt.size()) {
    auto logits = engine_->Decode(id, chunk, static_cast<int32_t>(lane.pos));
    if (!logits.ok()) {
      FinishLane(id, "", FromStatus(logits.status()));
      return;
    }
    lane.logits = std::move(*logits);
  } else if (absl::Status s = engine_->Prefill(id, chunk, static_cast<int32_t>(lane.pos)); !s.ok()) {
    // Only the last chunk's logits are read: the others skip the output projection.
    FinishLane(id, "", FromStatus(s));
    return;
  }
  lane.pos = end;
  ++lane.next_chunk;
  const auto& rb = lane.plan.record_boundaries;
  if (end < prompt.size() && std::binary_search(rb.begin(), rb.end(), end)) {
    const Clock::time_point record_start = Clock::now();
    if (cache_->DefersRecurrentRecords()) {
      if (auto p = cache_->CopyRecurrentState(id, end)) lane.pending.push_back(std::move(*p));
    } else if (!cache_->ExactBoundaryResident()) {
      cache_->RecordRecurrent(id, lane.scope, std::span(prompt.data(), end), lane.classes);
    } else {
      cache_->RecordResident(id, lane.scope, std::span(prompt.data(), end), lane.classes);
    }
    lane.timings.record_ms += MsBetween(record_start, Clock::now());
  }
  if (lane.pos == prompt.size()) {
    lane.prefill_done = Clock::now();
    lane.record_prompt_end = true;  // recorded once the first token is out (RecordPromptEnd)
    lane.phase = Phase::kGenerate;
    EmitToken(id);
  }
}

void Scheduler::RecordPromptEnd(int32_t id) {
  Lane& lane = lanes_[id];
  if (!lane.record_prompt_end) return;
  lane.record_prompt_end = false;
  const std::vector<Token>& prompt = lane.job->prompt().tokens;
  const auto& rb = lane.plan.record_boundaries;
  const bool record_prompt = std::binary_search(rb.begin(), rb.end(), prompt.size());
  if (cache_->DefersRecurrentRecords()) {
    cache_->RecordDeferred(id, lane.scope, prompt, lane.classes, record_prompt, lane.pending);
    lane.pending.clear();
  } else if (!cache_->ExactBoundaryResident() && record_prompt) {
    cache_->RecordRecurrent(id, lane.scope, prompt, lane.classes);
  }
  cache_->RecordResident(id, lane.scope, prompt, lane.classes);
  cache_->PutDecoded(lane.scope, prompt, lane.classes, lane.logits);
}

void Scheduler::EmitToken(int32_t id) {
  Lane& lane = lanes_[id];
  Job& job = *lane.job;
  if (lane.generated >= job.max_tokens()) {
    RecordPromptEnd(id);
    FinishLane(id, "length", std::nullopt);
    return;
  }
  const Token tok = lane.sampler->Sample(lane.logits);
  if (lane.generated == 0) {
    lane.timings.ttft_ms = MsBetween(job.arrival(), Clock::now());
    metrics_.ObserveTtft(lane.timings.ttft_ms / 1000.0);
  }
  if (!job.request().ignore_eos && runtime::IsEndOfGeneration(engine_->model(), tok)) {
    RecordPromptEnd(id);
    FinishLane(id, "stop", std::nullopt);
    return;
  }
  auto piece = runtime::TokenPiece(engine_->model(), tok);
  bool stop_hit = false;
  std::optional<TokenLogprobs> logprobs;
  if (job.request().n_probs > 0) logprobs = Logprobs(engine_->model(), lane.logits, tok, job.request().n_probs);
  job.Append(tok, piece.ok() ? *piece : std::string(), &stop_hit, std::move(logprobs));
  ++lane.generated;
  // The client has its first token; the lane still holds exactly the prompt.
  RecordPromptEnd(id);
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
  // Every generated token of a lane-batching server goes through DecodeStep, alone or not.
  if (lane_batching_) {
    GenerateTogether(std::span(&id, 1));
    return;
  }
  Lane& lane = lanes_[id];
  auto logits = engine_->Decode(id, std::span(&lane.next_token, 1), static_cast<int32_t>(lane.pos));
  if (!logits.ok()) {
    FinishLane(id, "", FromStatus(logits.status()));
    return;
  }
  lane.logits = std::move(*logits);
  ++lane.pos;
  EmitToken(id);
}

void Scheduler::GenerateTogether(std::span<const int32_t> ids) {
  std::vector<runtime::Engine::DecodeStepIn> steps;
  std::vector<int32_t> stepping;
  for (int32_t id : ids) {
    if (FinishIfCancelled(id)) continue;
    const Lane& lane = lanes_[id];
    steps.push_back({id, lane.next_token, static_cast<int32_t>(lane.pos)});
    stepping.push_back(id);
  }
  if (steps.empty()) return;
  auto logits = engine_->DecodeStep(steps);
  if (logits.ok() && steps.size() >= 2) steps_together_.fetch_add(1);
  for (size_t i = 0; i < stepping.size(); ++i) {
    Lane& lane = lanes_[stepping[i]];
    if (!logits.ok()) {
      FinishLane(stepping[i], "", FromStatus(logits.status()));
      continue;
    }
    lane.logits = std::move((*logits)[i]);
    ++lane.pos;
    EmitToken(stepping[i]);
  }
}

void Scheduler::FinishLane(int32_t id, std::string reason, std::optional<ApiError> error) {
  Lane& lane = lanes_[id];
  // Keep the prompt's KV for the next request when it was fully computed (generated tokens are
  // cut off: they were decoded one at a time, not in the prompt's batches).
  LaneMemory& held = held_[static_cast<size_t>(id)];
  held = LaneMemory{};
  // A hybrid lane keeps everything: its recurrent state cannot be cut, but its attention KV of the
  // prompt serves the next request with only a recurrent state restored (HybridLaneReuse).
  const size_t n = lane.job ? lane.job->prompt().tokens.size() : 0;
  const auto len = static_cast<int32_t>(n);
  const bool keep = !error && n > 0 && lane.pos >= n &&
                    ((cache_->LaneReuse() && engine_->Truncate(id, len).ok() && engine_->SequenceLength(id) == len) ||
                     (cache_->HybridLaneReuse() && engine_->SequenceLength(id) >= len));
  if (keep) {
    held.tokens = lane.job->prompt().tokens;
    held.cache_namespace = lane.scope.cache_namespace;
    held.classes = lane.classes;
  } else {
    (void)engine_->Clear(id);
  }
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
  {
    std::lock_guard lock(mu_);
    --busy_;
  }
  job->Finish(std::move(reason), std::move(error), timings);
}

}  // namespace skippy::server
