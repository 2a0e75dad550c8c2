// Serving workloads for skippy-bench serve-compare: deterministic request sequences (seeded, the
// same bytes on every machine) that exercise how prefixes compete for a server's cache.
//
//   exact-repeat          one prompt repeated
//   shared-prefix         one long system prompt, many different short questions
//   interleaved-prefixes  K long documents visited round robin (K larger than lanes/slots)
//   multi-turn            several conversations growing turn by turn, interleaved (scripted replies)
//   chat-replies          the same, with each assistant turn the server's own reply sent back as
//                         text, as a chat client does (ReplyChain)
//   agent-loop            a tool-call transcript that grows by one tool result per step
//   divergent-suffix      a long stored prefix, then requests that share only part of it
//   long-answers          questions on one shared system prompt answered at length, and every third
//                         request a cold document asked a short question: long prefills arriving
//                         while other lanes stream (what time-per-token targets are for)
//   restart               long documents asked about, the server restarted, each asked again (its
//                         headline is the phase after the restart), then once more warm
//
// Every request's prompt is fixed in advance (assistant turns are scripted, not generated), so both
// servers see the same prompts and their greedy outputs can be compared request by request; except
// chat-replies, where each server's prompts carry its own replies (compared only up to the first
// reply that differs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "skippy/common/status.h"

namespace skippy::bench {

struct WorkloadRequest {
  std::string stream;  // conversation / document id, for reports
  std::string prompt;
  int n_predict = 8;
  // The server is stopped (gracefully) and started again before this request.
  bool restart_before = false;
  std::string phase;  // "" or a phase of the workload ("first", "after-restart", "warm")
  // The prompt continues this stream's previous request: what was sent then, the server's reply
  // to it, then `prompt` (ReplyChain). Such requests must run in order within their stream.
  bool after_reply = false;
};

// The prompts of one run of a workload with after_reply requests, built as the run goes.
class ReplyChain {
 public:
  // The text to send for `r`: its prompt, or its stream's last prompt and reply followed by it.
  std::string PromptFor(const WorkloadRequest& r) const;
  // `prompt` (as PromptFor gave it) was answered with `reply`.
  void Answered(const WorkloadRequest& r, const std::string& prompt, const std::string& reply);

 private:
  std::map<std::string, std::string> sent_;  // stream -> its last prompt and reply
};

struct Workload {
  std::string name;
  std::string description;
  std::vector<WorkloadRequest> requests;
  // The phase whose requests a run's summary covers ("": all requests).
  std::string headline_phase;
  bool has_replies() const;  // some request is after_reply
};

struct WorkloadOptions {
  uint64_t seed = 1;
  int long_prefix_words = 900;  // ~1.2k tokens with BPE vocabularies
  int short_words = 20;
  int requests = 12;            // for repeat / shared-prefix
  int documents = 8;            // interleaved-prefixes K
  int rounds = 3;               // interleaved-prefixes visits per document
  int conversations = 4;        // multi-turn
  int turns = 4;
  int agent_steps = 8;
  int n_predict = 8;
  int answer_tokens = 128;      // long-answers: generated tokens of its long answers
};

// The workload names, in report order.
const std::vector<std::string>& WorkloadNames();

// NotFound (listing the names) for an unknown workload; InvalidArgument for non-positive sizes.
StatusOr<Workload> MakeWorkload(const std::string& name, const WorkloadOptions& options);

}  // namespace skippy::bench
