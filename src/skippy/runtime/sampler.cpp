#include "skippy/runtime/sampler.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "common/json-schema-to-grammar.h"  // llama.cpp's converter (cmake/llama_common.cmake)
#include "common/reasoning-budget.h"        // llama.cpp's reasoning-block tracker
#include "llama.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/llama_backend.h"

namespace skippy::runtime {

Status Sampler::Validate(const SamplingParams& p, int32_t n_vocab) {
  for (const auto& [token, bias] : p.logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f) && !(std::isinf(bias) && bias < 0)) {
      return absl::InvalidArgumentError(StrCat("a logit bias must lie in [-100, 100] (or ban the token), not ", bias));
    }
    if (token < 0 || (n_vocab > 0 && token >= n_vocab)) {
      return absl::InvalidArgumentError(StrCat("logit bias on token id ", token, ", outside the vocabulary"));
    }
  }
  if (!(p.temperature >= 0.0f)) return absl::InvalidArgumentError("temperature must be >= 0");
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) return absl::InvalidArgumentError("top_p must lie in [0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return absl::InvalidArgumentError("min_p must lie in [0, 1]");
  // The window is a ring buffer llama.cpp allocates; a repeat penalty near 0 divides logits to inf.
  if (p.penalty_last_n < 0 || p.penalty_last_n > (1 << 20)) {
    return absl::InvalidArgumentError("the penalty window must lie in [0, 1048576] tokens");
  }
  if (!(p.repeat_penalty >= 0.001f && p.repeat_penalty <= 10.0f)) {
    return absl::InvalidArgumentError("repeat_penalty must lie in [0.001, 10]");
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError("frequency_penalty must lie in [-2, 2]");
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError("presence_penalty must lie in [-2, 2]");
  }
  return absl::OkStatus();
}

namespace {

// Bounds on what llama.cpp's grammar parser is given. It recurses once per nested group and once
// per rule along a chain of rules (a request could overflow a thread's stack), and it writes out
// each repetition: "<1,000 characters>"{1999} is about two million elements from a kilobyte of
// text. kMaxGrammarElements bounds those copies (llama_grammar_element: 8 bytes each).
constexpr size_t kMaxGrammarBytes = 128 * 1024;
constexpr int kMaxGrammarNesting = 64;
constexpr size_t kMaxGrammarRules = 4096;
constexpr size_t kMaxGrammarElements = 1 << 20;

// A linear scan of GBNF text (comments, literals, classes, groups, repetitions) for the bounds
// above: the elements each repetition writes out are estimated from the element before it (a
// literal's or a class's characters; a group or a rule is one reference).
Status CheckGrammarBounds(std::string_view g) {
  if (g.size() > kMaxGrammarBytes) {
    return absl::InvalidArgumentError(StrCat("the grammar has ", g.size(), " bytes, more than ", kMaxGrammarBytes));
  }
  int depth = 0;
  size_t rules = 0, elements = 0, last = 1;  // `last`: the size of the element before a repetition
  for (size_t i = 0; i < g.size(); ++i) {
    const char c = g[i];
    if (c == '#') {
      while (i < g.size() && g[i] != '\n') ++i;
    } else if (c == '"' || c == '[') {
      const char close = c == '"' ? '"' : ']';
      const size_t start = i;
      for (++i; i < g.size() && g[i] != close; ++i) {
        if (g[i] == '\\') ++i;
      }
      last = std::max<size_t>(1, i - start);
      elements += last;
    } else if (c == '(') {
      if (++depth > kMaxGrammarNesting) {
        return absl::InvalidArgumentError(StrCat("the grammar nests groups deeper than ", kMaxGrammarNesting));
      }
    } else if (c == ')') {
      --depth;
      last = 1;
    } else if (c == ':' && g.substr(i, 3) == "::=") {
      if (++rules > kMaxGrammarRules) {
        return absl::InvalidArgumentError(StrCat("the grammar has more than ", kMaxGrammarRules, " rules"));
      }
      i += 2;
    } else if (c == '*' || c == '+' || c == '?') {
      elements += 2 * last;
    } else if (c == '{') {
      size_t most = 0, n = 0;
      for (++i; i < g.size() && g[i] != '}'; ++i) {
        if (g[i] >= '0' && g[i] <= '9') {
          n = std::min<size_t>(n * 10 + static_cast<size_t>(g[i] - '0'), kMaxGrammarElements);
        } else {
          most = std::max(most, n);
          n = 0;
        }
      }
      most = std::max(most, n) + 1;
      elements += std::min(most, kMaxGrammarElements) * last;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '<') {
      if (c == '<') {
        while (i < g.size() && g[i] != '>') ++i;
      }
      last = 1;
      ++elements;
    }
    if (elements > kMaxGrammarElements) {
      return absl::InvalidArgumentError(
          StrCat("the grammar writes out more than ", kMaxGrammarElements, " elements (repetitions of long elements)"));
    }
  }
  return absl::OkStatus();
}

// The grammar sampler for `grammar`, or InvalidArgument with llama.cpp's reason (its parser logs
// it and returns nullptr: a syntax error, no `root` rule, left recursion, a repetition past its
// limit).
StatusOr<llama_sampler*> InitGrammar(const Model& model, const std::string& grammar, const SamplingParams* lazy = nullptr) {
  SKIPPY_RETURN_IF_ERROR(CheckGrammarBounds(grammar));
  (void)TakeLlamaLogTail();  // what the parser logs next is about this grammar
  llama_sampler* g = nullptr;
  const llama_vocab* vocab = llama_model_get_vocab(model.raw());
  try {
    if (lazy != nullptr) {
      std::vector<const char*> patterns;
      for (const std::string& pattern : lazy->grammar_trigger_patterns) patterns.push_back(pattern.c_str());
      g = llama_sampler_init_grammar_lazy_patterns(vocab, grammar.c_str(), "root", patterns.data(), patterns.size(),
                                                   lazy->grammar_trigger_tokens.data(),
                                                   lazy->grammar_trigger_tokens.size());
    } else {
      g = llama_sampler_init_grammar(vocab, grammar.c_str(), "root");
    }
  } catch (const std::exception& e) {  // std::regex_error from a trigger pattern, among others
    return absl::InvalidArgumentError(StrCat("the grammar does not parse: ", e.what()));
  }
  if (g == nullptr) {
    std::string why = TakeLlamaLogTail();
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    // llama.cpp prints a syntax error's detail to stderr, and logs only this line.
    if (why == "failed to parse grammar") why = "a syntax error (llama.cpp's GBNF)";
    return absl::InvalidArgumentError(StrCat("the grammar does not parse", why.empty() ? "" : ": ", why));
  }
  return g;
}

bool Masked(float logit) { return std::isinf(logit) && logit < 0; }

// The token `chain` samples from `data` (every candidate, or those a grammar left), or greedy's
// without a chain: the first maximum in id order (as std::max_element over the logits). -1 when
// every candidate is masked.
Token Pick(llama_sampler* chain, std::vector<llama_token_data>& data) {
  if (chain == nullptr) {
    const auto best = std::max_element(data.begin(), data.end(),
                                       [](const llama_token_data& a, const llama_token_data& b) { return a.logit < b.logit; });
    return best == data.end() || Masked(best->logit) ? -1 : best->id;
  }
  llama_token_data_array arr{data.data(), data.size(), -1, false};
  llama_sampler_apply(chain, &arr);
  if (arr.selected < 0 || static_cast<size_t>(arr.selected) >= arr.size) return -1;
  return Masked(arr.data[arr.selected].logit) ? -1 : arr.data[arr.selected].id;
}

std::vector<llama_token_data> Candidates(std::span<const float> logits) {
  std::vector<llama_token_data> data(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) data[i] = {static_cast<llama_token>(i), logits[i], 0.0f};
  return data;
}

// The grammar sampler of `p` (lazy, or having read its prefill), or InvalidArgument.
StatusOr<llama_sampler*> InitGrammar(const Model& model, const SamplingParams& p) {
  if (p.grammar_lazy) {
    if (p.grammar_trigger_patterns.empty() && p.grammar_trigger_tokens.empty()) {
      return absl::InvalidArgumentError("a lazy grammar needs a trigger");
    }
    for (const Token t : p.grammar_trigger_tokens) {
      if (t < 0 || t >= model.n_vocab()) return absl::InvalidArgumentError(StrCat("trigger token ", t, " is outside the vocabulary"));
    }
    return InitGrammar(model, p.grammar, &p);
  }
  SKIPPY_ASSIGN_OR_RETURN(llama_sampler * g, InitGrammar(model, p.grammar));
  for (const Token t : p.grammar_prefill) {
    try {
      if (t < 0 || t >= model.n_vocab()) throw std::out_of_range(StrCat("token ", t, " is outside the vocabulary"));
      // llama.cpp aborts on an end-of-generation token its grammar is not complete at.
      if (IsEndOfGeneration(model, t)) throw std::invalid_argument("an end-of-generation token");
      llama_sampler_accept(g, t);
    } catch (const std::exception& e) {
      llama_sampler_free(g);
      return absl::InvalidArgumentError(StrCat("the grammar refuses the text it starts after: ", e.what()));
    }
  }
  return g;
}

}  // namespace

Status Sampler::ValidateGrammar(const Model& model, const std::string& grammar) {
  SamplingParams p;
  p.grammar = grammar;
  return ValidateGrammar(model, p);
}

Status Sampler::ValidateGrammar(const Model& model, const SamplingParams& p) {
  if (p.grammar.empty()) return absl::OkStatus();
  SKIPPY_ASSIGN_OR_RETURN(llama_sampler * g, InitGrammar(model, p));
  llama_sampler_free(g);
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Sampler>> Sampler::Create(const SamplingParams& p, int32_t n_vocab,
                                                   std::span<const Token> history) {
  return Make(p, n_vocab, nullptr, history);
}

StatusOr<std::unique_ptr<Sampler>> Sampler::Create(const SamplingParams& p, const Model& model,
                                                   std::span<const Token> history) {
  return Make(p, model.n_vocab(), &model, history);
}

StatusOr<std::unique_ptr<Sampler>> Sampler::Make(const SamplingParams& p, int32_t n_vocab, const Model* model,
                                                 std::span<const Token> history) {
  SKIPPY_RETURN_IF_ERROR(Validate(p, n_vocab));
  if ((p.penalized() || !p.logit_bias.empty()) && n_vocab <= 0) {
    return absl::InvalidArgumentError("penalties and a logit bias need the vocabulary size");
  }
  if (!p.grammar.empty() && model == nullptr) return absl::InvalidArgumentError("a grammar needs the model's vocabulary");
  std::unique_ptr<Sampler> s(new Sampler());
  // The grammar sees the generated tokens only, as llama-server's.
  if (!p.grammar.empty()) {
    SKIPPY_ASSIGN_OR_RETURN(s->grammar_, InitGrammar(*model, p));
    if (p.grammar_lazy && !p.reasoning_start.empty() && !p.reasoning_end.empty()) {
      // llama.cpp's reasoning budget, unbounded: it only tracks the block (common_sampler_init).
      const llama_vocab* vocab = llama_model_get_vocab(model->raw());
      for (const std::vector<Token>& seq : {p.reasoning_start, p.reasoning_prefill}) {
        for (const Token t : seq) {
          if (t < 0 || t >= model->n_vocab()) return absl::InvalidArgumentError("a reasoning token is outside the vocabulary");
        }
      }
      s->vocab_ = vocab;
      s->reasoning_ = common_reasoning_budget_init(vocab, {p.reasoning_start}, p.reasoning_end, p.reasoning_end.front(),
                                                   std::numeric_limits<int32_t>::max());
      for (const Token t : p.reasoning_prefill) llama_sampler_accept(s->reasoning_, t);
    }
  }
  if (p.temperature <= 0.0f && !p.penalized() && p.logit_bias.empty()) return s;
  llama_sampler_chain_params cp = llama_sampler_chain_default_params();
  cp.no_perf = true;
  s->chain_ = llama_sampler_chain_init(cp);
  if (!p.logit_bias.empty()) {
    std::vector<llama_logit_bias> biases;
    for (const auto& [token, bias] : p.logit_bias) biases.push_back({token, bias});
    llama_sampler_chain_add(s->chain_, llama_sampler_init_logit_bias(n_vocab, static_cast<int32_t>(biases.size()),
                                                                     biases.data()));
  }
  if (p.penalized()) {
    llama_sampler_chain_add(s->chain_, llama_sampler_init_penalties(n_vocab, p.penalty_last_n, p.repeat_penalty,
                                                                    p.frequency_penalty, p.presence_penalty));
    // The window keeps only its last penalty_last_n tokens: counting those leaves the state that
    // counting the whole prompt would.
    const size_t keep = std::min(history.size(), static_cast<size_t>(p.penalty_last_n));
    for (const Token t : history.last(keep)) llama_sampler_accept(s->chain_, t);
  }
  if (p.temperature <= 0.0f) {
    // Greedy after the penalties: the first maximum in id order, as the greedy path above.
    llama_sampler_chain_add(s->chain_, llama_sampler_init_greedy());
    return s;
  }
  if (p.top_k > 0) llama_sampler_chain_add(s->chain_, llama_sampler_init_top_k(p.top_k));
  if (p.top_p < 1.0f) llama_sampler_chain_add(s->chain_, llama_sampler_init_top_p(p.top_p, 1));
  if (p.min_p > 0.0f) llama_sampler_chain_add(s->chain_, llama_sampler_init_min_p(p.min_p, 1));
  llama_sampler_chain_add(s->chain_, llama_sampler_init_temp(p.temperature));
  llama_sampler_chain_add(s->chain_, llama_sampler_init_dist(p.seed));
  return s;
}

Sampler::~Sampler() {
  if (chain_ != nullptr) llama_sampler_free(chain_);
  if (grammar_ != nullptr) llama_sampler_free(grammar_);
  if (reasoning_ != nullptr) llama_sampler_free(reasoning_);
}

bool Sampler::GrammarApplies() const {
  if (grammar_ == nullptr) return false;
  if (reasoning_ == nullptr) return true;
  const common_reasoning_budget_state state = common_reasoning_budget_get_state(reasoning_);
  return state == REASONING_BUDGET_IDLE || state == REASONING_BUDGET_DONE;
}

StatusOr<Token> Sampler::Sample(std::span<const float> logits) {
  if (chain_ == nullptr && grammar_ == nullptr) {
    return static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Greedy without a chain reads the logits as they are: no candidate array unless the grammar
  // refuses its token.
  std::vector<llama_token_data> data;
  Token t = -1;
  if (chain_ == nullptr) {
    t = static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (Masked(logits[static_cast<size_t>(t)])) t = -1;
  } else {
    data = Candidates(logits);
    t = Pick(chain_, data);
  }
  if (t < 0) return absl::FailedPreconditionError("no token is left to sample: every one is banned or -infinity");
  const bool apply_grammar = GrammarApplies();
  if (apply_grammar) {
    // As llama-server: the chain's token stands if the grammar allows it; otherwise the grammar
    // masks every candidate and the chain samples again from what is left.
    llama_token_data one{t, logits[static_cast<size_t>(t)], 0.0f};
    llama_token_data_array single{&one, 1, -1, false};
    llama_sampler_apply(grammar_, &single);
    if (Masked(one.logit)) {
      data = Candidates(logits);
      llama_token_data_array all{data.data(), data.size(), -1, false};
      llama_sampler_apply(grammar_, &all);
      t = Pick(chain_, data);
      if (t < 0) return absl::FailedPreconditionError("the grammar allows none of the tokens left here");
    }
  }
  try {
    if (reasoning_ != nullptr) {
      llama_sampler_accept(reasoning_, t);
      // The block just ended: the grammar reads its end (which may hold a trigger), as in
      // llama-server (common_sampler_accept).
      if (grammar_ != nullptr && !apply_grammar && common_reasoning_budget_get_state(reasoning_) == REASONING_BUDGET_DONE) {
        if (const std::vector<llama_token>* end = common_reasoning_budget_get_end_match(reasoning_)) {
          for (const llama_token e : *end) {
            if (llama_vocab_is_eog(vocab_, e)) continue;  // llama.cpp's grammar aborts on one it is not complete at
            llama_sampler_accept(grammar_, e);
          }
        }
      }
    }
    if (apply_grammar) llama_sampler_accept(grammar_, t);
  } catch (const std::exception& e) {
    return absl::InternalError(StrCat("the grammar refused the token it allowed: ", e.what()));
  }
  if (chain_ != nullptr) llama_sampler_accept(chain_, t);
  return t;
}

bool IsEndOfGeneration(const Model& model, Token token) {
  if (token < 0 || token >= model.n_vocab()) return false;
  return llama_vocab_is_eog(llama_model_get_vocab(model.raw()), token);
}

StatusOr<std::string> TokenPiece(const Model& model, Token token, bool special) {
  if (token < 0 || token >= model.n_vocab()) {
    return absl::InvalidArgumentError(StrCat("token id ", token, " is outside the vocabulary"));
  }
  const llama_vocab* vocab = llama_model_get_vocab(model.raw());
  std::string out(32, '\0');
  int32_t n = llama_token_to_piece(vocab, token, out.data(), static_cast<int32_t>(out.size()), 0, special);
  if (n < 0) {
    out.resize(static_cast<size_t>(-n));
    n = llama_token_to_piece(vocab, token, out.data(), static_cast<int32_t>(out.size()), 0, special);
  }
  if (n < 0) return absl::InternalError("token_to_piece failed");
  out.resize(static_cast<size_t>(n));
  return out;
}

Status CheckJsonSchemaBounds(std::string_view schema_json) {
  // The converter copies the schema for each reference it resolves and recurses along chains of
  // them: both bounded here.
  constexpr size_t kMaxSchemaBytes = 64 * 1024;
  constexpr size_t kMaxSchemaRefs = 64;
  if (schema_json.size() > kMaxSchemaBytes) {
    return absl::InvalidArgumentError(StrCat("the schema has ", schema_json.size(), " bytes, more than ", kMaxSchemaBytes));
  }
  size_t refs = 0;
  for (size_t at = schema_json.find("\"$ref\""); at != std::string::npos; at = schema_json.find("\"$ref\"", at + 1)) {
    if (++refs > kMaxSchemaRefs) {
      return absl::InvalidArgumentError(StrCat("the schema has more than ", kMaxSchemaRefs, " $ref"));
    }
  }
  return absl::OkStatus();
}

StatusOr<std::string> GrammarFromJsonSchema(const std::string& schema_json) {
  SKIPPY_RETURN_IF_ERROR(CheckJsonSchemaBounds(schema_json));
  try {
    // force_gbnf: llama.cpp built with llguidance would return its own format otherwise.
    return json_schema_to_grammar(common_json::parse(schema_json), /*force_gbnf=*/true);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

}  // namespace skippy::runtime
