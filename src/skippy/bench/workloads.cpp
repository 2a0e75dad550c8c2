#include "skippy/bench/workloads.h"

#include <algorithm>
#include <array>
#include <random>

#include "skippy/common/strings.h"

namespace skippy::bench {
namespace {

// std::mt19937_64's output sequence is fixed by the standard (distributions are not), so prompts
// are drawn from raw engine output only.
class Words {
 public:
  explicit Words(uint64_t seed) : rng_(seed) {}
  std::string Sentence(int words) {
    static constexpr std::array<const char*, 48> kWords = {
        "cache",   "request", "server",  "prefix",  "token",   "model",   "memory", "state",   "restore", "exact",
        "system",  "prompt",  "user",    "answer",  "document", "section", "table",  "query",   "result",  "latency",
        "shared",  "context", "window",  "layer",   "batch",   "lane",    "slot",   "queue",   "budget",  "policy",
        "evict",   "record",  "replay",  "stream",  "client",  "tenant",  "salt",   "digest",  "block",   "payload",
        "compute", "reuse",   "measure", "median",  "report",  "family",  "hybrid", "attention"};
    std::string s;
    for (int i = 0; i < words; ++i) {
      std::string w = kWords[rng_() % kWords.size()];
      if (i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
      s += (i ? " " : "") + w;
      if (i + 1 < words && rng_() % 9 == 0) s += ",";
    }
    return s + ".";
  }
  std::string Paragraphs(int words) {
    std::string s;
    while (words > 0) {
      const int n = std::min(words, 8 + static_cast<int>(rng_() % 10));
      s += (s.empty() ? "" : " ") + Sentence(n);
      words -= n;
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
};

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

const std::vector<std::string>& WorkloadNames() {
  static const std::vector<std::string> kNames = {"exact-repeat", "shared-prefix", "interleaved-prefixes",
                                                  "multi-turn",   "chat-replies",  "agent-loop",
                                                  "divergent-suffix", "long-answers", "restart"};
  return kNames;
}

StatusOr<Workload> MakeWorkload(const std::string& name, const WorkloadOptions& o) {
  if (o.long_prefix_words < 1 || o.short_words < 1 || o.requests < 1 || o.documents < 1 || o.rounds < 1 ||
      o.conversations < 1 || o.turns < 1 || o.agent_steps < 1 || o.n_predict < 1 || o.answer_tokens < 1) {
    return absl::InvalidArgumentError("workload sizes must be positive");
  }
  Words words(o.seed * 0x9e3779b97f4a7c15ULL ^ Fnv1a(name));
  Workload w;
  w.name = name;
  auto add = [&](std::string stream, std::string prompt) {
    WorkloadRequest r;
    r.stream = std::move(stream);
    r.prompt = std::move(prompt);
    r.n_predict = o.n_predict;
    w.requests.push_back(std::move(r));
  };

  if (name == "exact-repeat") {
    w.description = "one prompt repeated";
    const std::string p = "System: " + words.Paragraphs(o.long_prefix_words / 3) + "\nUser: " + words.Sentence(o.short_words) + "\nAssistant:";
    for (int i = 0; i < o.requests; ++i) add("repeat", p);
  } else if (name == "shared-prefix") {
    w.description = "one long system prompt, different short questions";
    const std::string sys = "System: " + words.Paragraphs(o.long_prefix_words) + "\n";
    for (int i = 0; i < o.requests; ++i) add(StrCat("q", i), sys + "User: " + words.Sentence(o.short_words) + "\nAssistant:");
  } else if (name == "interleaved-prefixes") {
    w.description = StrCat(o.documents, " long documents visited round robin, ", o.rounds, " rounds");
    std::vector<std::string> docs;
    for (int d = 0; d < o.documents; ++d) docs.push_back(StrCat("Document ", d, ": ", words.Paragraphs(o.long_prefix_words), "\n"));
    for (int r = 0; r < o.rounds; ++r) {
      for (int d = 0; d < o.documents; ++d) {
        add(StrCat("doc", d), docs[static_cast<size_t>(d)] + "Question: " + words.Sentence(o.short_words) + "\nAnswer:");
      }
    }
  } else if (name == "multi-turn") {
    w.description = StrCat(o.conversations, " conversations of ", o.turns, " turns, interleaved");
    std::vector<std::string> history;
    for (int c = 0; c < o.conversations; ++c) history.push_back("System: " + words.Paragraphs(o.long_prefix_words / 2) + "\n");
    for (int t = 0; t < o.turns; ++t) {
      for (int c = 0; c < o.conversations; ++c) {
        std::string& h = history[static_cast<size_t>(c)];
        h += "User: " + words.Sentence(o.short_words) + "\nAssistant:";
        add(StrCat("conv", c), h);
        h += " " + words.Sentence(o.short_words * 2) + "\n";  // scripted reply
      }
    }
  } else if (name == "chat-replies") {
    w.description = StrCat(o.conversations, " conversations of ", o.turns, " turns, interleaved, each reply the server's own");
    for (int t = 0; t < o.turns; ++t) {
      for (int c = 0; c < o.conversations; ++c) {
        if (t == 0) {
          add(StrCat("conv", c), "System: " + words.Paragraphs(o.long_prefix_words / 2) + "\nUser: " +
                                     words.Sentence(o.short_words) + "\nAssistant:");
        } else {
          add(StrCat("conv", c), "\nUser: " + words.Sentence(o.short_words) + "\nAssistant:");
          w.requests.back().after_reply = true;
        }
      }
    }
  } else if (name == "agent-loop") {
    w.description = StrCat("tool-call transcript growing for ", o.agent_steps, " steps");
    std::string t = "System: You are an agent. Tools: search(query), read(path), run(command).\n" +
                    words.Paragraphs(o.long_prefix_words / 2) + "\nTask: " + words.Sentence(o.short_words) + "\n";
    for (int s = 0; s < o.agent_steps; ++s) {
      add("agent", t + "Next tool call:");
      t += StrCat("Call ", s, ": run(\"", words.Sentence(4), "\")\nResult ", s, ": ", words.Paragraphs(o.long_prefix_words / 8), "\n");
    }
  } else if (name == "divergent-suffix") {
    w.description = "a long stored prefix, then requests that diverge inside it";
    std::vector<std::string> sentences;
    int budget = o.long_prefix_words;
    while (budget > 0) {
      const int n = std::min(budget, 12);
      sentences.push_back(words.Sentence(n));
      budget -= n;
    }
    auto prefix_upto = [&](size_t n) {
      std::string s = "Context:";
      for (size_t i = 0; i < n && i < sentences.size(); ++i) s += " " + sentences[i];
      return s;
    };
    add("full", prefix_upto(sentences.size()) + "\nQuestion: " + words.Sentence(o.short_words) + "\nAnswer:");
    for (double frac : {0.9, 0.75, 0.5, 0.9, 0.25, 0.75}) {
      const size_t keep = static_cast<size_t>(frac * static_cast<double>(sentences.size()));
      add(StrCat("keep", static_cast<int>(frac * 100)),
          prefix_upto(keep) + " " + words.Paragraphs(o.long_prefix_words / 10) + "\nQuestion: " + words.Sentence(o.short_words) + "\nAnswer:");
    }
  } else if (name == "long-answers") {
    w.description = StrCat(2 * o.documents, " questions on a shared system prompt answered in ", o.answer_tokens, " tokens, ",
                           o.documents, " cold documents asked a short question, one in every three requests");
    const std::string sys = "System: " + words.Paragraphs(o.long_prefix_words / 2) + "\n";
    for (int d = 0; d < o.documents; ++d) {
      for (int q = 0; q < 2; ++q) {
        add(StrCat("answer", 2 * d + q), sys + "User: " + words.Sentence(o.short_words) + "\nAssistant:");
        w.requests.back().n_predict = o.answer_tokens;
      }
      add(StrCat("doc", d), StrCat("Document ", d, ": ", words.Paragraphs(o.long_prefix_words), "\nQuestion: ",
                                   words.Sentence(o.short_words), "\nAnswer:"));
    }
  } else if (name == "restart") {
    w.description = StrCat(o.documents, " documents asked about, the server restarted, each asked again, then once more");
    w.headline_phase = "after-restart";
    std::vector<std::string> docs;
    // ~2k tokens each at the default size (long_prefix_words 900).
    for (int d = 0; d < o.documents; ++d) {
      docs.push_back(StrCat("Document ", d, ": ", words.Paragraphs(o.long_prefix_words * 5 / 3), "\n"));
    }
    for (const char* phase : {"first", "after-restart", "warm"}) {
      for (int d = 0; d < o.documents; ++d) {
        add(StrCat("doc", d), docs[static_cast<size_t>(d)] + "Question: " + words.Sentence(o.short_words) + "\nAnswer:");
        w.requests.back().phase = phase;
        w.requests.back().restart_before = d == 0 && std::string_view(phase) == "after-restart";
      }
    }
  } else {
    return absl::NotFoundError(StrCat("unknown workload '", name, "'; known: ", fmt::format("{}", fmt::join(WorkloadNames(), ", "))));
  }
  return w;
}

bool Workload::has_replies() const {
  return std::any_of(requests.begin(), requests.end(), [](const WorkloadRequest& r) { return r.after_reply; });
}

std::string ReplyChain::PromptFor(const WorkloadRequest& r) const {
  if (!r.after_reply) return r.prompt;
  auto it = sent_.find(r.stream);
  return (it == sent_.end() ? std::string() : it->second) + r.prompt;
}

void ReplyChain::Answered(const WorkloadRequest& r, const std::string& prompt, const std::string& reply) {
  sent_[r.stream] = prompt + reply;
}

}  // namespace skippy::bench
