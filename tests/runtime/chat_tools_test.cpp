// Tools through the chat template (OpenAI function calling, as llama-server does it with llama.cpp's
// chat code): the tools rendered into the prompt, the grammar that makes the answer a call, and
// the parser that reads the answer back into content and calls, whole and as a stream grows. The
// model is the tiny Llama with a template that writes tool calls; without one, tools are refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>

#include "../support/chat_template_gguf.h"
#include "nlohmann/json.hpp"
#include "skippy/runtime/chat.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/model.h"
#include "skippy/runtime/sampler.h"
#include "test_env.h"

namespace skippy::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Arguments from a closed set, so that a call the grammar forces ends within a few tokens whatever
// the logits.
const ChatTool kWeather{"get_weather", "The weather in a city",
                        R"({"type":"object","properties":{"unit":{"enum":["celsius","fahrenheit"]}},)"
                        R"("required":["unit"],"additionalProperties":false})"};
const ChatTool kTime{"get_time", "The time", R"({"type":"object","properties":{},"additionalProperties":false})"};

// The sampling a chat with tools runs with, greedy.
SamplingParams SamplingFor(const ToolCalling& calling) {
  SamplingParams p;
  ConstrainToCalls(calling, p);
  return p;
}

// Samples from random logits (drawn from `rng`), except that the first tokens are forced to
// `forced` (each must be what the sampler returns), until `text` holds a closed call; false if
// none closed within `limit` tokens.
bool SampleUntilACallCloses(const Model& model, Sampler& sampler, const ToolCalling& calling,
                            const std::vector<Token>& forced, std::mt19937& rng, std::string& text, size_t limit = 400) {
  std::normal_distribution<float> noise(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(model.n_vocab()));
  for (size_t i = 0; i < limit; ++i) {
    for (float& l : logits) l = noise(rng);
    if (i < forced.size()) logits[static_cast<size_t>(forced[i])] = 1000.0f;
    auto tok = sampler.Sample(logits);
    EXPECT_TRUE(tok.ok()) << tok.status() << " after " << text;
    if (!tok.ok()) return false;
    if (i < forced.size()) EXPECT_EQ(*tok, forced[i]) << "the grammar refused forced text after " << text;
    if (IsEndOfGeneration(model, *tok)) return false;
    const bool special = std::find(calling.preserved_tokens.begin(), calling.preserved_tokens.end(), *tok) !=
                         calling.preserved_tokens.end();
    text += *TokenPiece(model, *tok, special);
    // The grammar would let random logits go on to more calls: the first one closed is enough.
    if (i >= forced.size() && text.find("</tool_call>") != std::string::npos) {
      text.erase(text.find("</tool_call>") + std::string_view("</tool_call>").size());
      return true;
    }
  }
  return false;
}

class ChatToolsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = (fs::temp_directory_path() / ("skippy-chat-tools-" + std::to_string(::getpid()) + ".gguf")).string();
    testing_support::WriteWithChatTemplate(testing_env::ZooFile("llama"), path_,
                                           testing_support::ToolCallTemplate());
    EnsureLlamaBackend();
    auto m = Model::Load(path_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    fs::remove(path_);
  }
  void SetUp() override { ASSERT_NE(model_, nullptr); }

  static ToolCalling Calling(ToolChoice choice) {
    ChatTools tools{{kWeather, kTime}, choice, std::nullopt};
    auto chat = RenderChat(*model_, {{"user", "Is it warm?"}}, true, 2, &tools);
    EXPECT_TRUE(chat.ok()) << chat.status();
    EXPECT_TRUE(chat.ok() && chat->tool_calling.has_value());
    return chat.ok() && chat->tool_calling ? *chat->tool_calling : ToolCalling{};
  }

  static inline std::string path_;
  static inline Model* model_ = nullptr;
};

TEST_F(ChatToolsTest, TheTemplateRendersTheToolsAndTheCallsGrammar) {
  ChatTools tools{{kWeather, kTime}, ToolChoice::kAuto, std::nullopt};
  auto chat = RenderChat(*model_, {{"system", "Be brief."}, {"user", "Is it warm?"}}, true, 2, &tools);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->template_name, "jinja");
  EXPECT_NE(chat->text.find("<tools>"), std::string::npos) << chat->text;
  EXPECT_NE(chat->text.find("\"get_weather\""), std::string::npos) << chat->text;
  EXPECT_NE(chat->text.find("Be brief."), std::string::npos) << chat->text;
  ASSERT_TRUE(chat->tool_calling);
  // auto: the model may answer in text, so the grammar waits for a call's opening.
  EXPECT_FALSE(chat->tool_calling->grammar.empty());
  EXPECT_TRUE(chat->tool_calling->grammar_lazy);
  EXPECT_FALSE(chat->tool_calling->trigger_patterns.empty() && chat->tool_calling->trigger_tokens.empty());
  // The boundary before the final turn counts with the tools rendered too.
  EXPECT_FALSE(chat->message_ends.empty());

  const ToolCalling required = Calling(ToolChoice::kRequired);
  EXPECT_FALSE(required.grammar.empty());
  EXPECT_FALSE(required.grammar_lazy);
  EXPECT_TRUE(required.parse_tool_calls);
  EXPECT_FALSE(Calling(ToolChoice::kNone).parse_tool_calls);

  // Without tools the rendering is the template's plain one.
  auto plain = RenderChat(*model_, {{"user", "Is it warm?"}}, true, 2);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->tool_calling);
  EXPECT_EQ(plain->text, "<|im_start|>user\nIs it warm?<|im_end|>\n<|im_start|>assistant\n");
}

TEST_F(ChatToolsTest, CallsAndResultsInTheConversationAreRendered) {
  ChatTools tools{{kWeather}, ToolChoice::kAuto, std::nullopt};
  std::vector<ChatMessage> messages = {{"user", "Is it warm?"}};
  ChatMessage call{"assistant", ""};
  call.tool_calls = {{"call_1", "get_weather", R"({"unit": "celsius"})"}};
  ChatMessage result{"tool", "21 degrees"};
  result.tool_call_id = "call_1";
  messages.push_back(call);
  messages.push_back(result);
  auto chat = RenderChat(*model_, messages, true, 2, &tools);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_NE(chat->text.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}\n</tool_call>"),
            std::string::npos)
      << chat->text;
  EXPECT_NE(chat->text.find("<tool_response>\n21 degrees\n</tool_response>"), std::string::npos) << chat->text;
  // A call cannot be continued.
  auto continued = RenderChat(*model_, {{"user", "Is it warm?"}, call}, true, 2, &tools);
  EXPECT_EQ(continued.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ChatToolsTest, TheParserReadsCallsAndTheDeltasOfAGrowingAnswerAddUpToThem) {
  auto parser = ReplyParser::Create(Calling(ToolChoice::kAuto));
  ASSERT_TRUE(parser.ok()) << parser.status();
  const std::string answer =
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}\n</tool_call>";
  auto whole = (*parser)->Parse(answer, /*partial=*/false);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->tool_calls.size(), 1u) << whole->content;
  EXPECT_EQ(whole->tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(whole->tool_calls[0].arguments), json({{"unit", "celsius"}}));
  EXPECT_EQ(whole->content, "Let me look.\n");

  auto text = (*parser)->Parse("It is warm.", false);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->content, "It is warm.");
  EXPECT_TRUE(text->tool_calls.empty());

  // As a stream: the parse of each longer prefix, and the deltas from the last one sent.
  ParsedReply sent;
  std::string content, name, arguments;
  for (size_t n = 1; n <= answer.size(); ++n) {
    auto part = (*parser)->Parse(answer.substr(0, n), /*partial=*/n < answer.size());
    ASSERT_TRUE(part.ok()) << n << ": " << part.status();
    auto deltas = ReplyDeltas(sent, *part);
    if (!deltas.ok()) continue;  // a parse that takes back text waits for more, as the server does
    for (const ReplyDelta& d : *deltas) {
      content += d.content;
      if (d.tool_call_index) {
        EXPECT_EQ(*d.tool_call_index, 0u);
        name += d.tool_call.name;  // as a client adds them up
        arguments += d.tool_call.arguments;
      }
    }
    sent = *part;
  }
  EXPECT_EQ(sent, *whole);
  EXPECT_EQ(content, whole->content);
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(arguments), json({{"unit", "celsius"}}));
}

// The grammar lets the model write text before a call ("required" as llama-server has it: the
// answer must end in a call). Once the model opens a call, here forced for the tokens that spell
// the opening and drawn at random after them, the grammar leaves only a call to one of the tools,
// with arguments its schema allows, which the parser reads back. The same for "auto", whose lazy
// grammar starts at the opening.
// A continued assistant message: the reply is what was generated after it, as without tools.
TEST_F(ChatToolsTest, AContinuedMessagesReplyLeavesOutWhatItBeganWith) {
  ChatTools tools{{kWeather}, ToolChoice::kAuto, std::nullopt};
  auto chat = RenderChat(*model_, {{"user", "Is it warm?"}, {"assistant", "Let me"}}, true, 2, &tools);
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_TRUE(chat->tool_calling);
  EXPECT_TRUE(chat->tool_calling->continues);
  EXPECT_TRUE(chat->text.ends_with("Let me")) << chat->text;
  auto parser = ReplyParser::Create(*chat->tool_calling);
  ASSERT_TRUE(parser.ok()) << parser.status();
  auto reply = (*parser)->Parse(" look.", false);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->content, " look.");
}

// A stream names each call once, whole: a name a partial parse read part of waits for the call's
// arguments (or the end), and later deltas carry arguments only.
TEST(StreamDeltas, ACallIsNamedOnceWhole) {
  std::vector<bool> named;
  ParsedReply before;
  ParsedReply text{.content = "Let me look."};
  auto d1 = StreamDeltas(before, text, true, named);
  ASSERT_TRUE(d1.ok());
  ASSERT_EQ(d1->size(), 1u);
  EXPECT_EQ((*d1)[0].content, "Let me look.");
  ParsedReply growing = text;
  growing.tool_calls = {{"call_1", "get_", ""}};
  auto d2 = StreamDeltas(text, growing, true, named);
  ASSERT_TRUE(d2.ok());
  EXPECT_TRUE(d2->empty()) << "a name still growing waits";
  ParsedReply args = text;
  args.tool_calls = {{"call_1", "get_weather", "{\"unit\""}};
  auto d3 = StreamDeltas(growing, args, true, named);
  ASSERT_TRUE(d3.ok());
  std::string name, arguments, id;
  for (const ReplyDelta& d : *d3) {
    ASSERT_EQ(d.tool_call_index, 0u);
    id += d.tool_call.id;
    name += d.tool_call.name;
    arguments += d.tool_call.arguments;
  }
  EXPECT_EQ(id, "call_1");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(arguments, "{\"unit\"");
  ParsedReply more = args;
  more.tool_calls[0].arguments += ": 1}";
  more.tool_calls.push_back({"call_2", "get_time", ""});
  auto d4 = StreamDeltas(args, more, /*partial=*/false, named);
  ASSERT_TRUE(d4.ok());
  ASSERT_EQ(d4->size(), 2u);
  for (const ReplyDelta& d : *d4) {
    if (d.tool_call_index == 0u) {
      EXPECT_EQ(d.tool_call.name, "") << "named already";
      EXPECT_EQ(d.tool_call.id, "");
      EXPECT_EQ(d.tool_call.arguments, ": 1}");
    } else {
      EXPECT_EQ(d.tool_call_index, 1u);
      EXPECT_EQ(d.tool_call.name, "get_time") << "a call without arguments is named when the answer is whole";
      EXPECT_EQ(d.tool_call.id, "call_2");
    }
  }
}

TEST_F(ChatToolsTest, OnceACallIsOpenedTheGrammarLeavesOnlyACall) {
  auto opening = model_->Tokenize("<tool_call>\n", /*add_special=*/false, /*parse_special=*/true);
  ASSERT_TRUE(opening.ok()) << opening.status();
  for (const ToolChoice choice : {ToolChoice::kRequired, ToolChoice::kAuto}) {
    const ToolCalling calling = Calling(choice);
    auto parser = ReplyParser::Create(calling);
    ASSERT_TRUE(parser.ok()) << parser.status();
    for (uint32_t seed = 1; seed <= 2; ++seed) {  // each draw masks the vocabulary per token: seconds
      auto sampler = Sampler::Create(SamplingFor(calling), *model_);
      ASSERT_TRUE(sampler.ok()) << sampler.status();
      std::mt19937 rng(seed);
      std::string text;
      ASSERT_TRUE(SampleUntilACallCloses(*model_, **sampler, calling, *opening, rng, text)) << "seed " << seed << ": " << text;
      auto reply = (*parser)->Parse(text, false);
      ASSERT_TRUE(reply.ok()) << reply.status() << ": " << text;
      ASSERT_FALSE(reply->tool_calls.empty()) << text;
      for (const ToolCall& c : reply->tool_calls) {
        EXPECT_TRUE(c.name == "get_weather" || c.name == "get_time") << text;
        const json args = json::parse(c.arguments);
        EXPECT_TRUE(args.is_object()) << text;
        if (c.name == "get_weather") EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << text;
        if (c.name == "get_time") EXPECT_TRUE(args.empty()) << text;
      }
    }
  }
}

// On a template that thinks, a call drafted inside the reasoning block does not start the lazy
// grammar (llama-server keeps the grammar out of the block): "<tool_call>" and text that is no
// call, inside <think>, are sampled as forced; after </think> the opening starts the grammar, and
// the parser reads the reasoning apart from the call.
TEST(ChatToolsThinking, ACallDraftedInTheReasoningDoesNotStartTheGrammar) {
  const std::string path =
      (fs::temp_directory_path() / ("skippy-chat-tools-think-" + std::to_string(::getpid()) + ".gguf")).string();
  testing_support::WriteWithChatTemplate(testing_env::ZooFile("llama"), path, testing_support::ToolCallTemplate(/*thinking=*/true));
  EnsureLlamaBackend();
  auto model = Model::Load(path);
  fs::remove(path);
  ASSERT_TRUE(model.ok()) << model.status();
  ChatTools tools{{kWeather, kTime}, ToolChoice::kAuto, std::nullopt};
  auto chat = RenderChat(**model, {{"user", "Is it warm?"}}, true, 2, &tools);
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_TRUE(chat->tool_calling);
  const ToolCalling& calling = *chat->tool_calling;
  ASSERT_TRUE(calling.grammar_lazy);
  ASSERT_FALSE(calling.reasoning_start.empty());
  ASSERT_FALSE(calling.reasoning_end.empty());
  auto sampler = Sampler::Create(SamplingFor(calling), **model);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  // The tags as their own tokens, as a model whose vocabulary has them as special tokens writes them
  // (the block is tracked by token sequence, as in llama-server).
  std::vector<Token> forced;
  for (const char* part : {"<think>", "\nMaybe <tool_call>\nno call at all\n", "</think>", "\n<tool_call>\n"}) {
    auto ids = (*model)->Tokenize(part, /*add_special=*/false, /*parse_special=*/true);
    ASSERT_TRUE(ids.ok());
    forced.insert(forced.end(), ids->begin(), ids->end());
  }
  std::mt19937 rng(7);
  std::string text;
  ASSERT_TRUE(SampleUntilACallCloses(**model, **sampler, calling, forced, rng, text)) << text;
  auto parser = ReplyParser::Create(calling);
  ASSERT_TRUE(parser.ok()) << parser.status();
  auto reply = (*parser)->Parse(text, false);
  ASSERT_TRUE(reply.ok()) << reply.status() << ": " << text;
  EXPECT_EQ(reply->reasoning_content, "Maybe <tool_call>\nno call at all\n") << text;
  EXPECT_FALSE(reply->tool_calls.empty()) << text;
  for (const ToolCall& c : reply->tool_calls) EXPECT_TRUE(c.name == "get_weather" || c.name == "get_time") << text;
}

// The zoo's models have no template; llama.cpp's default (ChatML) writes no calls.
TEST_F(ChatToolsTest, AModelWhoseTemplateWritesNoCallsRefusesTools) {
  EnsureLlamaBackend();
  auto plain = Model::Load(testing_env::ZooFile("llama"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ChatTools tools{{kWeather}, ToolChoice::kAuto, std::nullopt};
  auto refused = RenderChat(**plain, {{"user", "Is it warm?"}}, true, 2, &tools);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("does not write tool calls"), std::string_view::npos) << refused.status();
  tools.choice = ToolChoice::kNone;
  EXPECT_TRUE(RenderChat(**plain, {{"user", "Is it warm?"}}, true, 2, &tools).ok());
}

}  // namespace
}  // namespace skippy::runtime
