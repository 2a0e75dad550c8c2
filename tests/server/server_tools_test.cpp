// Function calling over HTTP (OpenAI's tools on /v1/chat/completions), on the tiny Llama with a
// chat template that writes tool calls: the tools are rendered and their grammar runs, the answer
// is the same from a cache hit, from a server without the cache and streamed; the next turn of an
// agent loop (a call and its result) reuses the previous prompt; bad tool requests are 400s that
// leave the server healthy.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "../support/chat_template_gguf.h"
#include "server_process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using skippy::server_test::PostJson;
using skippy::server_test::ServerProcess;

const json kTools = json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "The weather in a city"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"unit", {{"enum", {"celsius", "fahrenheit"}}}}}},
          {"required", {"unit"}},
          {"additionalProperties", false}}}}}},
     {{"type", "function"},
      {"function", {{"name", "get_time"}, {"description", "The time"}, {"parameters", {{"type", "object"}}}}}}});

json Ask(const std::string& question) {
  return {{"messages", {{{"role", "system"}, {"content", "You answer with tools."}}, {{"role", "user"}, {"content", question}}}},
          {"tools", kTools},
          {"tool_choice", "required"},
          {"max_tokens", 64},
          {"temperature", 0}};
}

class ServerTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = (fs::temp_directory_path() / ("skippy-server-tools-" + std::to_string(::getpid()) + ".gguf")).string();
    skippy::testing_support::WriteWithChatTemplate(skippy::server_test::ZooFile("llama"), path_,
                                                   skippy::testing_support::ToolCallTemplate());
    server_ = ServerProcess::Start(path_, {"-c", "1024", "-np", "2"}, "tools").release();
    no_cache_ = ServerProcess::Start(path_, {"-c", "1024", "-np", "1", "--no-cache"}, "tools-no-cache").release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete no_cache_;
    server_ = no_cache_ = nullptr;
    fs::remove(path_);
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(no_cache_, nullptr);
  }
  void TearDown() override { EXPECT_TRUE(server_->alive()) << server_->LogTail(); }

  static inline std::string path_;
  static inline ServerProcess* server_ = nullptr;
  static inline ServerProcess* no_cache_ = nullptr;
};

// The answer without the ids of its calls (made up per request) or the response's own fields.
json Answer(const json& response) {
  json a = response["choices"][0];
  if (a["message"].contains("tool_calls")) {
    for (json& call : a["message"]["tool_calls"]) call.erase("id");
  }
  return a;
}

// The random weights write text, not calls (tests/server tool_reply_test and tests/runtime
// chat_tools_test read and force calls): what is checked here is the request's way through the
// server with tools rendered and their grammar active, as for any chat.
TEST_F(ServerTools, AChatWithToolsIsCachedAndExactLikeAnyOther) {
  auto c = server_->Client();
  for (const char* choice : {"auto", "required"}) {
    json req = Ask("Is it warm in Paris today, and what time is it there?");
    req["tool_choice"] = choice;
    req["logprobs"] = true;
    req["max_tokens"] = 12;
    auto [s, first] = PostJson(*c, "/v1/chat/completions", req);
    ASSERT_EQ(s, 200) << first.dump();
    const std::string finish = first["choices"][0]["finish_reason"];
    EXPECT_TRUE(finish == "stop" || finish == "length" || finish == "tool_calls") << first.dump();
    // The tools are in the prompt.
    json plain = req;
    plain.erase("tools");
    plain.erase("tool_choice");
    auto [sp, without] = PostJson(*c, "/v1/chat/completions", plain);
    ASSERT_EQ(sp, 200) << without.dump();
    EXPECT_GT(first["usage"]["prompt_tokens"].get<int>(), without["usage"]["prompt_tokens"].get<int>() + 40);

    // A repeat restores the prompt, and --no-cache recomputes it: the same answer and
    // log-probabilities either way.
    auto [s2, again] = PostJson(*c, "/v1/chat/completions", req);
    ASSERT_EQ(s2, 200) << again.dump();
    EXPECT_GT(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << again.dump();
    EXPECT_EQ(Answer(again), Answer(first)) << choice;
    auto n = no_cache_->Client();
    auto [s3, recomputed] = PostJson(*n, "/v1/chat/completions", req);
    ASSERT_EQ(s3, 200) << recomputed.dump();
    EXPECT_EQ(Answer(recomputed), Answer(first)) << choice;

    // Streamed, the deltas add up to the same text.
    req["stream"] = true;
    req.erase("logprobs");
    auto r = c->Post("/v1/chat/completions", req.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string content, streamed_finish;
    bool done = false;
    size_t at = 0;
    while (at < r->body.size()) {
      size_t end = r->body.find('\n', at);
      if (end == std::string::npos) end = r->body.size();
      const std::string line = r->body.substr(at, end - at);
      at = end + 1;
      if (line.rfind("data: ", 0) != 0) continue;
      if (line == "data: [DONE]") {
        done = true;
        continue;
      }
      const json event = json::parse(line.substr(6));
      ASSERT_FALSE(event.contains("error")) << line;
      const json& ch = event["choices"][0];
      if (!ch["finish_reason"].is_null()) streamed_finish = ch["finish_reason"];
      content += ch["delta"].value("content", "");
    }
    EXPECT_TRUE(done);
    EXPECT_EQ(streamed_finish, finish);
    if (finish != "tool_calls") EXPECT_EQ(content, first["choices"][0]["message"]["content"].get<std::string>());
  }
}

// An agent loop: the assistant's call comes back with its result, and the next request reuses
// the prompt that asked for it.
TEST_F(ServerTools, TheNextTurnOfAnAgentLoopReusesThePrompt) {
  auto c = server_->Client();
  json req = Ask("Is it warm in Oslo?");
  req["tool_choice"] = "auto";
  auto [s, first] = PostJson(*c, "/v1/chat/completions", req);
  ASSERT_EQ(s, 200) << first.dump();
  json next = req;
  next["messages"].push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"unit\": \"celsius\"}"}}}}}}});
  next["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"degrees\": 21}"}});
  auto [s2, second] = PostJson(*c, "/v1/chat/completions", next);
  ASSERT_EQ(s2, 200) << second.dump();
  const int prompt = second["usage"]["prompt_tokens"];
  const int cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, first["usage"]["prompt_tokens"].get<int>() / 2) << second.dump();
  EXPECT_LT(cached, prompt) << second.dump();
  // An assistant message sent back as a chat with tools answers it, with its reasoning.
  json with_reasoning = next;
  with_reasoning["messages"][2]["reasoning_content"] = "The user asks about the weather.";
  auto [s4, fourth] = PostJson(*c, "/v1/chat/completions", with_reasoning);
  EXPECT_EQ(s4, 200) << fourth.dump();
  // tool_choice none: the tools are in the prompt, no call is read, and a grammar of the request's
  // own still holds the answer.
  next["tool_choice"] = "none";
  next["grammar"] = "root ::= \"yes\" | \"no\"";
  auto [s3, third] = PostJson(*c, "/v1/chat/completions", next);
  ASSERT_EQ(s3, 200) << third.dump();
  EXPECT_FALSE(third["choices"][0]["message"].contains("tool_calls")) << third.dump();
  const std::string answer = third["choices"][0]["message"]["content"];
  EXPECT_TRUE(answer == "yes" || answer == "no") << third.dump();
}

TEST_F(ServerTools, BadToolRequestsAre400s) {
  auto c = server_->Client();
  auto with = [](const std::string& key, json value) {
    json req = Ask("hello");
    req[key] = std::move(value);
    return req;
  };
  json bad_name = kTools;
  bad_name[0]["function"]["name"] = "get weather";
  json duplicate = kTools;
  duplicate[1]["function"]["name"] = "get_weather";
  json bad_params = kTools;
  bad_params[0]["function"]["parameters"] = "object";
  json bad_type = kTools;
  bad_type[0]["type"] = "retrieval";
  json extra = kTools;
  extra[0]["function"]["parameterz"] = json::object();
  json user_call = Ask("hello");
  user_call["messages"][1]["tool_calls"] = {{{"id", "x"}, {"type", "function"}, {"function", {{"name", "get_time"}, {"arguments", "{}"}}}}};
  json user_call_id = Ask("hello");
  user_call_id["messages"][1]["tool_call_id"] = "x";
  json bad_arguments = Ask("hello");
  bad_arguments["messages"].push_back({{"role", "assistant"},
                                       {"tool_calls", {{{"id", "x"}, {"type", "function"}, {"function", {{"name", "get_time"}, {"arguments", 7}}}}}}});
  json many_refs = kTools;
  json props = json::object();
  for (int i = 0; i < 65; ++i) props["p" + std::to_string(i)] = {{"$ref", "#/$defs/x"}};
  many_refs[0]["function"]["parameters"] = {{"type", "object"}, {"properties", props}, {"$defs", {{"x", {{"type", "integer"}}}}}};
  json dangling_ref = kTools;
  dangling_ref[0]["function"]["parameters"] = {{"type", "object"}, {"properties", {{"a", {{"$ref", "#/nowhere"}}}}}};
  json deep_arguments = Ask("hello");
  deep_arguments["messages"].push_back(
      {{"role", "assistant"},
       {"tool_calls",
        {{{"id", "x"}, {"type", "function"}, {"function", {{"name", "get_time"}, {"arguments", std::string(100, '[') + std::string(100, ']')}}}}}}});
  json no_tools = Ask("hello");
  no_tools.erase("tools");
  const std::vector<std::pair<json, std::string>> cases = {
      {with("tools", bad_name), ""},
      {with("tools", duplicate), ""},
      {with("tools", bad_params), ""},
      {with("tools", bad_type), "unsupported_field"},
      {with("tools", extra), ""},
      {with("tools", "get_time"), ""},
      {with("tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}), "unsupported_field"},
      {with("tool_choice", "sometimes"), ""},
      {with("grammar", "root ::= \"x\""), "invalid_grammar"},
      {with("response_format", {{"type", "json_object"}}), "invalid_grammar"},
      {user_call, ""},
      {user_call_id, ""},
      {bad_arguments, ""},
      {no_tools, ""},
      {with("tools", many_refs), "invalid_grammar"},
      {with("tools", dangling_ref), ""},
      {deep_arguments, "json_too_deep"},
  };
  for (const auto& [body, code] : cases) {
    auto [s, r] = PostJson(*c, "/v1/chat/completions", body);
    EXPECT_EQ(s, 400) << body.dump() << " -> " << r.dump();
    ASSERT_TRUE(r.contains("error")) << r.dump();
    if (!code.empty()) EXPECT_EQ(r["error"]["code"], code) << r.dump();
  }
  auto [s, ok] = PostJson(*c, "/v1/chat/completions", Ask("hello"));
  EXPECT_EQ(s, 200) << ok.dump();
}

}  // namespace
