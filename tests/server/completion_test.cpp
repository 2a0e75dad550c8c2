// Job and Completion without a server: stop strings and what a stream sends while they may match.
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "skippy/server/job.h"
#include "skippy/server/response.h"
#include "stream_events.h"

namespace skippy::server {
namespace {

using nlohmann::json;

Job MakeJob(std::vector<std::string> stop) {
  GenerationRequest r;
  r.endpoint = Endpoint::kLlamaCompletion;
  r.stop = std::move(stop);
  return Job(std::move(r), PreparedPrompt{{1, 2, 3}, {}}, "", 16);
}

TEST(JobStop, TheTextEndsWhereTheEarliestStopStringBegins) {
  Job job = MakeJob({"b", "a"});
  bool hit = false;
  job.Append(7, "xy", &hit);
  EXPECT_FALSE(hit);
  job.Append(8, "zab", &hit);  // "a" begins before "b", though "b" is listed first
  EXPECT_TRUE(hit);
  EXPECT_EQ(job.text(), "xyz");
}

TEST(JobStop, AStopStringAcrossPiecesIsFound) {
  Job job = MakeJob({"\n\n", "END"});
  bool hit = false;
  job.Append(7, "one\n", &hit);
  EXPECT_FALSE(hit);
  job.Append(8, "\ntwo", &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(job.text(), "one");
}

// A stream with a stop string holds back its last bytes; the cut must not split a character.
TEST(CompletionStream, HeldBytesNeverSplitACharacter) {
  GenerationRequest r;
  r.endpoint = Endpoint::kLlamaCompletion;
  r.stop = {"\n\n"};  // holds one byte back
  r.stream = true;
  Job job(r, PreparedPrompt{{1, 2, 3}, {}}, "", 16);
  bool hit = false;
  job.Append(7, "caf\xC3\xA9", &hit);  // "café": its last character is two bytes

  Events out;
  const Completion completion(Endpoint::kLlamaCompletion, r, "m", 3);
  Completion::StreamState state;
  std::thread streaming([&] { completion.Stream(job, state, out.sink); });
  out.Await(1);  // the job finishes only after the stream sent what it could while not done
  job.Finish("stop", std::nullopt, {});
  streaming.join();

  std::string content;
  for (const json& e : out.events) content += e.value("content", "");
  EXPECT_EQ(content, "caf\xC3\xA9");
  EXPECT_EQ(out.events.front()["content"], "caf") << "sent while the last byte was held";
}

// Each token's log-probabilities go out once, in the event that carries the token, though a
// stream's polls see only those past what it sent.
TEST(CompletionStream, EachTokensLogprobsGoOutOnce) {
  GenerationRequest r;
  r.endpoint = Endpoint::kLlamaCompletion;
  r.stream = true;
  r.n_probs = 2;
  Job job(r, PreparedPrompt{{1, 2, 3}, {}}, "", 16);
  auto probs = [](runtime::Token id) {
    TokenLogprobs t;
    t.chosen = {id, "p" + std::to_string(id), -0.5};
    t.top = {{id, "p" + std::to_string(id), -0.5}, {id + 1, "q", -1.5}};
    return t;
  };
  Events out;
  const Completion completion(Endpoint::kLlamaCompletion, r, "m", 3);
  Completion::StreamState state;
  bool hit = false;
  job.Append(10, "a", &hit, probs(10));
  std::thread streaming([&] { completion.Stream(job, state, out.sink); });
  for (runtime::Token id : {11, 12}) {
    out.Await(static_cast<size_t>(id - 10));
    job.Append(id, "b", &hit, probs(id));
  }
  out.Await(3);
  job.Finish("length", std::nullopt, {});
  streaming.join();
  std::vector<int> ids;
  for (const json& e : out.events) {
    for (const json& p : e.value("completion_probabilities", json::array())) ids.push_back(p["id"].get<int>());
  }
  EXPECT_EQ(ids, (std::vector<int>{10, 11, 12}));
}

}  // namespace
}  // namespace skippy::server
