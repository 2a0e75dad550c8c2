// Sampler: greedy takes the lowest id among the maxima; the repetition penalties (llama.cpp's
// penalties sampler, first in the chain as in llama-server) count the history given at creation
// and every sampled token, within their window; out-of-range values are refused. A grammar keeps
// every sampled token within what it accepts, greedy or drawn, on the tiny Llama's vocabulary.
#include "skippy/runtime/sampler.h"

#include <gtest/gtest.h>

#include <cctype>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "skippy/common/strings.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/model.h"
#include "test_env.h"

namespace skippy::runtime {
namespace {

constexpr int32_t kVocab = 4;
const std::vector<float> kLogits = {0.0f, 5.0f, 4.5f, 1.0f};  // token 1 first, token 2 close behind

Token Greedy(SamplingParams p, std::vector<Token> history) {
  auto s = Sampler::Create(p, kVocab, history);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? (*s)->Sample(kLogits).value_or(-1) : -1;
}

TEST(Sampler, GreedyTakesTheLowestIdAmongTheMaxima) {
  auto s = Sampler::Create({}, kVocab);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Sample(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}).value_or(-1), 1);
}

TEST(Sampler, PenaltiesCountTheHistoryAndTheSampledTokensInTheirWindow) {
  SamplingParams p;
  EXPECT_EQ(Greedy(p, {1, 1, 1}), 1);  // no penalty
  p.frequency_penalty = 0.4f;          // per occurrence
  EXPECT_EQ(Greedy(p, {1}), 1);        // 5 - 0.4 > 4.5
  EXPECT_EQ(Greedy(p, {1, 1}), 2);     // 5 - 0.8 < 4.5
  p = {};
  p.presence_penalty = 1.0f;           // once, whatever the count: 5 - 1 < 4.5
  EXPECT_EQ(Greedy(p, {1}), 2);
  p = {};
  p.repeat_penalty = 2.0f;             // 5 / 2 < 4.5
  EXPECT_EQ(Greedy(p, {3, 1}), 2);
  p.penalty_last_n = 1;                // only the last token (3) is in the window
  EXPECT_EQ(Greedy(p, {1, 3}), 1);

  // A sampled token joins the history: greedy alternates under a strong presence penalty.
  p = {};
  p.presence_penalty = 1.0f;
  auto s = Sampler::Create(p, kVocab, {});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Sample(kLogits).value_or(-1), 1);
  EXPECT_EQ((*s)->Sample(kLogits).value_or(-1), 2);  // 1 was sampled: 4 < 4.5
  EXPECT_EQ((*s)->Sample(kLogits).value_or(-1), 1);  // both penalized once: 4 > 3.5
}

TEST(Sampler, ALogitBiasComesFirstAndFalseBans) {
  SamplingParams p;
  p.logit_bias = {{1, -std::numeric_limits<float>::infinity()}};
  EXPECT_EQ(Greedy(p, {}), 2);
  p.logit_bias = {{3, 4.5f}};  // 1 + 4.5 > 5
  EXPECT_EQ(Greedy(p, {}), 3);
  p.logit_bias = {{1, -1.0f}};
  p.presence_penalty = 0.1f;  // after the bias: 5 - 1 - 0.1 < 4.5
  EXPECT_EQ(Greedy(p, {1}), 2);
  // Banning every token leaves nothing to sample: an error, not a banned token.
  p = {};
  for (Token t = 0; t < kVocab; ++t) p.logit_bias.emplace_back(t, -std::numeric_limits<float>::infinity());
  auto s = Sampler::Create(p, kVocab);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->Sample(kLogits).status().code(), absl::StatusCode::kFailedPrecondition);
  for (auto bias : std::vector<std::pair<Token, float>>{{1, 101.0f}, {1, -100.5f}, {kVocab, 1.0f}, {-1, 1.0f},
                                                        {1, std::numeric_limits<float>::quiet_NaN()},
                                                        {1, std::numeric_limits<float>::infinity()}}) {
    p = {};
    p.logit_bias = {bias};
    EXPECT_EQ(Sampler::Create(p, kVocab).status().code(), absl::StatusCode::kInvalidArgument) << bias.first;
  }
}

TEST(Sampler, OutOfRangePenaltiesAreRefused) {
  for (auto set : std::vector<void (*)(SamplingParams&)>{
           [](SamplingParams& p) { p.repeat_penalty = 0.0f; },
           [](SamplingParams& p) { p.repeat_penalty = 11.0f; },
           [](SamplingParams& p) { p.frequency_penalty = 2.5f; },
           [](SamplingParams& p) { p.presence_penalty = -2.5f; },
           [](SamplingParams& p) { p.penalty_last_n = -1; },
           [](SamplingParams& p) { p.penalty_last_n = (1 << 20) + 1; }}) {
    SamplingParams p;
    set(p);
    EXPECT_FALSE(Sampler::Validate(p).ok());
    EXPECT_FALSE(Sampler::Create(p, kVocab).ok());
  }
  SamplingParams p;
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(Sampler::Create(p, 0).ok()) << "penalties need the vocabulary size";
}

// Samples until the end of generation from random logits that favour `favoured` (a token the
// grammar refuses), and returns the text.
std::string SampleText(const Model& model, SamplingParams p, Token favoured, uint32_t seed) {
  auto s = Sampler::Create(p, model);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return "<no sampler>";
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 2.0f);
  std::string text;
  for (int i = 0; i < 256; ++i) {
    std::vector<float> logits(static_cast<size_t>(model.n_vocab()));
    for (float& l : logits) l = noise(rng);
    logits[static_cast<size_t>(favoured)] = 50.0f;
    auto t = (*s)->Sample(logits);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok() || IsEndOfGeneration(model, *t)) return text;
    text += TokenPiece(model, *t).value_or("?");
  }
  return text + "<no end>";
}

TEST(SamplerGrammar, EverySampledTokenStaysWithinTheGrammar) {
  EnsureLlamaBackend();
  auto model = Model::Load(testing_env::ZooFile("llama"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto z = (*model)->Tokenize("z", /*add_special=*/false);
  ASSERT_TRUE(z.ok() && !z->empty());
  SamplingParams p;
  p.grammar = R"(root ::= "yes" | "no" | "maybe")";
  // Without the grammar the favoured token wins every time.
  const std::string zp = TokenPiece(**model, z->back()).value_or("?");
  EXPECT_EQ(SampleText(**model, SamplingParams{}, z->back(), 1).substr(0, 2 * zp.size()), zp + zp);
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const std::string greedy = SampleText(**model, p, z->back(), seed);
    EXPECT_TRUE(greedy == "yes" || greedy == "no" || greedy == "maybe") << greedy;
    SamplingParams drawn = p;
    drawn.temperature = 1.0f;
    drawn.seed = seed;
    drawn.presence_penalty = 0.5f;
    const std::string text = SampleText(**model, drawn, z->back(), seed);
    EXPECT_TRUE(text == "yes" || text == "no" || text == "maybe") << text;
  }
  // A JSON schema's grammar: the text is the JSON it describes.
  auto schema = GrammarFromJsonSchema(R"({"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":9}},
                                          "required":["n"],"additionalProperties":false})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  p.grammar = *schema;
  std::string json_text = SampleText(**model, p, z->back(), 7);
  while (!json_text.empty() && std::isspace(static_cast<unsigned char>(json_text.back()))) json_text.pop_back();
  EXPECT_EQ(json_text.find('{'), 0u) << json_text;
  EXPECT_NE(json_text.find("\"n\""), std::string::npos) << json_text;
  ASSERT_FALSE(json_text.empty());
  EXPECT_EQ(json_text.back(), '}') << json_text;
}

TEST(SamplerGrammar, GrammarsThatDoNotParseAndSchemasThatDoNotConvertAreRefused) {
  EnsureLlamaBackend();
  auto model = Model::Load(testing_env::ZooFile("llama"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(Sampler::ValidateGrammar(**model, "").ok());
  EXPECT_TRUE(Sampler::ValidateGrammar(**model, R"(root ::= [a-z]+)").ok());
  for (const char* bad : {"root ::= (", "root ::= root \"a\"", "answer ::= \"a\"", "root ::= \"a\"{5000}",
                          "root ::= undefined-rule"}) {
    const Status s = Sampler::ValidateGrammar(**model, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    SamplingParams p;
    p.grammar = bad;
    EXPECT_EQ(Sampler::Create(p, **model).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // Bounds on what reaches llama.cpp's parser, which recurses per group (a deep one would overflow
  // the stack) and writes out every repetition.
  auto nested = [](int depth) {
    return "root ::= " + std::string(static_cast<size_t>(depth), '(') + "\"a\"" + std::string(static_cast<size_t>(depth), ')');
  };
  EXPECT_TRUE(Sampler::ValidateGrammar(**model, nested(64)).ok());
  EXPECT_EQ(Sampler::ValidateGrammar(**model, nested(65)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Sampler::ValidateGrammar(**model, nested(200000)).code(), absl::StatusCode::kInvalidArgument);
  const std::string literal = "\"" + std::string(1000, 'a') + "\"";
  EXPECT_TRUE(Sampler::ValidateGrammar(**model, "root ::= " + literal + "{100}").ok());
  EXPECT_EQ(Sampler::ValidateGrammar(**model, "root ::= " + literal + "{1999}").code(), absl::StatusCode::kInvalidArgument);
  std::string chain;
  for (int i = 0; i < 5000; ++i) chain += StrCat("r", i, " ::= r", i + 1, "\n");
  EXPECT_EQ(Sampler::ValidateGrammar(**model, "root ::= r0\n" + chain + "r5000 ::= \"a\"").code(),
            absl::StatusCode::kInvalidArgument);
  SamplingParams p;
  p.grammar = "root ::= \"a\"";
  EXPECT_EQ(Sampler::Create(p, kVocab).status().code(), absl::StatusCode::kInvalidArgument);  // no vocabulary
  EXPECT_TRUE(GrammarFromJsonSchema("{}").ok());
  for (const char* bad : {R"({"$ref": "#/nowhere"})", "not json", R"({"type": "object", "properties": 5})"}) {
    EXPECT_EQ(GrammarFromJsonSchema(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace skippy::runtime
