// A chat answer with tools read back without a server: the text a model wrote, as a Job holds it,
// becomes message.tool_calls (finish_reason "tool_calls") in a body, and deltas in a stream that
// add up to the same calls with the same ids; text that is not a call stays content. The parser
// comes from the tiny Llama with a template that writes calls.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <thread>

#include "../support/chat_template_gguf.h"
#include "nlohmann/json.hpp"
#include "skippy/runtime/chat.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/model.h"
#include "skippy/server/job.h"
#include "skippy/server/response.h"
#include "stream_events.h"
#include "test_env.h"

namespace skippy::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ToolReply : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path =
        (fs::temp_directory_path() / ("skippy-tool-reply-" + std::to_string(::getpid()) + ".gguf")).string();
    testing_support::WriteWithChatTemplate(testing_env::ZooFile("llama"), path, testing_support::ToolCallTemplate());
    runtime::EnsureLlamaBackend();
    auto model = runtime::Model::Load(path);
    fs::remove(path);
    ASSERT_TRUE(model.ok()) << model.status();
    runtime::ChatTools tools{{{"get_weather", "The weather", R"({"type":"object","properties":{"unit":{"type":"string"}}})"}},
                             runtime::ToolChoice::kAuto,
                             std::nullopt};
    auto chat = runtime::RenderChat(**model, {{"user", "Is it warm?"}}, true, 2, &tools);
    ASSERT_TRUE(chat.ok()) << chat.status();
    ASSERT_TRUE(chat->tool_calling);
    calling_ = new runtime::ToolCalling(*chat->tool_calling);
    auto parser = runtime::ReplyParser::Create(*calling_);
    ASSERT_TRUE(parser.ok()) << parser.status();
    parser_ = new std::shared_ptr<const runtime::ReplyParser>(*parser);
  }
  static void TearDownTestSuite() {
    delete calling_;
    delete parser_;
  }
  void SetUp() override { ASSERT_NE(parser_, nullptr); }

  // A chat job whose model wrote `pieces`, one token each, finished with `reason`.
  static std::shared_ptr<Job> Wrote(const std::vector<std::string>& pieces, const std::string& reason, bool stream) {
    GenerationRequest r;
    r.endpoint = Endpoint::kChatCompletions;
    r.stream = stream;
    ApplyToolCalling(*calling_, r);
    PreparedPrompt p{{1, 2, 3}, {}};
    p.tool_calling = *calling_;
    p.reply_parser = *parser_;
    auto job = std::make_shared<Job>(r, p, "", 64);
    bool hit = false;
    for (size_t i = 0; i < pieces.size(); ++i) job->Append(static_cast<runtime::Token>(10 + i), pieces[i], &hit);
    if (!reason.empty()) job->Finish(reason, std::nullopt, {});
    return job;
  }

  static inline runtime::ToolCalling* calling_ = nullptr;
  static inline std::shared_ptr<const runtime::ReplyParser>* parser_ = nullptr;
};

const std::vector<std::string> kCall = {"Let me look.\n", "<tool_call>\n{\"name\": \"get_", "weather\", \"arguments\": ",
                                        "{\"unit\": \"cel", "sius\"}}\n</tool_call>"};

TEST_F(ToolReply, ABodyHasTheCallsAndTheTextBeforeThem) {
  auto job = Wrote(kCall, "stop", false);
  const Completion completion(Endpoint::kChatCompletions, job->request(), "m", 3, *parser_);
  const json body = completion.Body(job->Wait());
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << body.dump();
  EXPECT_EQ(choice["message"]["content"], "Let me look.\n") << body.dump();
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << body.dump();
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"unit", "celsius"}}));
  const std::string id = call["id"];
  EXPECT_EQ(id.rfind("call_", 0), 0u) << id;
  EXPECT_EQ(id.size(), 29u) << id;

  // Cut by max_tokens before the call's name was read: the text before it.
  auto cut = Wrote({"Let me look.\n", "<tool_call>\n{\"name\": \"get_wea"}, "length", false);
  const json cut_body = completion.Body(cut->Wait());
  EXPECT_EQ(cut_body["choices"][0]["finish_reason"], "length") << cut_body.dump();
  EXPECT_EQ(cut_body["choices"][0]["message"]["content"], "Let me look.\n") << cut_body.dump();
  EXPECT_FALSE(cut_body["choices"][0]["message"].contains("tool_calls")) << cut_body.dump();
  // Cut inside the arguments: a call, its arguments cut short.
  auto cut_args = Wrote({"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"cel"}, "length", false);
  const json args_body = completion.Body(cut_args->Wait());
  EXPECT_EQ(args_body["choices"][0]["finish_reason"], "length") << args_body.dump();
  ASSERT_EQ(args_body["choices"][0]["message"]["tool_calls"].size(), 1u) << args_body.dump();
  EXPECT_EQ(args_body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather") << args_body.dump();
  EXPECT_EQ(args_body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"unit\": \"cel")
      << args_body.dump();
  // Plain text is content.
  auto text = Wrote({"It is ", "warm."}, "stop", false);
  const json text_body = completion.Body(text->Wait());
  EXPECT_EQ(text_body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(text_body["choices"][0]["message"]["content"], "It is warm.");
  EXPECT_FALSE(text_body["choices"][0]["message"].contains("tool_calls"));
}

// The stream polls the job as tokens arrive: every poll parses the text so far and sends what
// changed; the calls' deltas add up to the body's calls, with the id and the whole name once, in
// the first. The answer is parsed whole at the end, also when the last poll saw all its text
// (`settle`: the job finishes a while after its last token, or at once).
class ToolReplyStream : public ToolReply, public ::testing::WithParamInterface<bool> {
 protected:
  // The events of a stream of a job whose model writes `pieces`, one token each, then stops.
  static std::vector<json> Streamed(const std::vector<std::string>& pieces, bool settle) {
    auto job = Wrote({}, "", true);
    const Completion completion(Endpoint::kChatCompletions, job->request(), "m", 3, *parser_);
    Events out;
    Completion::StreamState state;
    std::thread streaming([&] { completion.Stream(*job, state, out.sink); });
    bool hit = false;
    for (size_t i = 0; i < pieces.size(); ++i) {
      job->Append(static_cast<runtime::Token>(10 + i), pieces[i], &hit);
      // A poll sees each token (it wakes on every one); with `settle`, the last one too.
      if (settle || i + 1 < pieces.size()) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    job->Finish("stop", std::nullopt, {});
    streaming.join();
    EXPECT_TRUE(out.done_marker);
    return out.events;
  }
};

TEST_P(ToolReplyStream, DeltasAddUpToTheCalls) {
  std::string content, id, name, arguments, finish;
  for (const json& e : Streamed(kCall, GetParam())) {
    const json& choice = e["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    content += choice["delta"].value("content", "");
    for (const json& d : choice["delta"].value("tool_calls", json::array())) {
      EXPECT_EQ(d["index"], 0);
      if (id.empty()) {
        ASSERT_TRUE(d.contains("id")) << e.dump();
        id = d["id"];
        EXPECT_EQ(d["type"], "function");
      } else {
        EXPECT_FALSE(d.contains("id")) << "the id once: " << e.dump();
      }
      if (d.contains("function")) {
        name += d["function"].value("name", "");  // as a client adds them up
        arguments += d["function"].value("arguments", "");
      }
    }
  }
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(content, "Let me look.\n");
  EXPECT_EQ(id.rfind("call_", 0), 0u) << id;
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(arguments), json({{"unit", "celsius"}}));
}

// Text whose end could begin a call's opening ("<") is held back while the answer runs; what the
// stream sent in all is the body's content.
TEST_P(ToolReplyStream, TheStreamedTextIsTheBodys) {
  const std::vector<std::string> pieces = {"Warm, and 3 <", " 4 <"};
  auto whole = Wrote(pieces, "stop", false);
  const Completion body(Endpoint::kChatCompletions, whole->request(), "m", 3, *parser_);
  const std::string expected = body.Body(whole->Wait())["choices"][0]["message"]["content"];
  EXPECT_EQ(expected.substr(0, 11), "Warm, and 3");

  std::string content;
  for (const json& e : Streamed(pieces, GetParam())) content += e["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(content, expected);
}

INSTANTIATE_TEST_SUITE_P(Polls, ToolReplyStream, ::testing::Bool());

}  // namespace
}  // namespace skippy::server
