#include "skippy/server/job.h"

#include <algorithm>
#include <cmath>

namespace skippy::server {

using runtime::Token;

namespace {

TokenLogprobs::Candidate MakeCandidate(const runtime::Model& model, Token id, double logprob) {
  auto piece = runtime::TokenPiece(model, id);
  return {id, piece.ok() ? *piece : std::string(), logprob};
}

}  // namespace

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

Job::View Job::Snapshot() const { return view_; }

Job::View Job::WaitFor(size_t have_tokens, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return view_.done || view_.tokens.size() > have_tokens; });
  // Without the log-probabilities the caller has: a stream polls once a token, and copying them
  // all each time (candidates and their pieces) grew with the square of the answer, under the lock
  // the engine thread appends through.
  View v;
  v.tokens = view_.tokens;
  v.logprobs_from = std::min(have_tokens, view_.logprobs.size());
  v.logprobs.assign(view_.logprobs.begin() + static_cast<std::ptrdiff_t>(v.logprobs_from), view_.logprobs.end());
  v.text = view_.text;
  v.done = view_.done;
  v.error = view_.error;
  v.finish_reason = view_.finish_reason;
  v.timings = view_.timings;
  return v;
}

std::string Job::text() const {
  std::lock_guard lock(mu_);
  return view_.text;
}

bool Job::WaitDone(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return view_.done; });
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
  // The text ends where the earliest stop string begins, whichever of them it is.
  size_t cut = std::string::npos;
  for (const std::string& s : request_.stop) {
    const size_t from = old >= s.size() ? old - s.size() + 1 : 0;
    cut = std::min(cut, view_.text.find(s, from));
  }
  *stop_hit = cut != std::string::npos;
  if (*stop_hit) view_.text.resize(cut);
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
  // Before the waiters wake: whatever the client learns next already counts this job.
  if (on_done_) on_done_(view_);
  cv_.notify_all();
}

}  // namespace skippy::server
