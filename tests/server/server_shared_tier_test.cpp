// The shared tier on the serving path (--shared-redis): two skippy-server replicas on one Redis
// (started here, with a password). What one replica recorded, the other serves from Redis, with
// outputs and log-probabilities identical to a --no-cache server's, on a dense (llama), a
// sliding-window (gemma3) and a hybrid (qwen3next) tiny family; tenants stay apart across
// replicas; a Redis that is down leaves every request answered, and a refused password stops the
// server at startup with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "../support/redis_server.h"
#include "server_process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using skippy::server_test::PostJson;
using skippy::server_test::ServerProcess;
using skippy::testing::RedisServer;

std::vector<std::vector<int>> Documents(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int>> docs;
  for (int d = 0; d < n; ++d) {
    std::vector<int> v(std::uniform_int_distribution<int>(130, 250)(rng));
    for (int& t : v) t = std::uniform_int_distribution<int>(1000, 9000)(rng);
    docs.push_back(std::move(v));
  }
  return docs;
}

std::vector<int> Ask(std::vector<int> doc, int question) {
  for (int i = 0; i < 12; ++i) doc.push_back(500 + 37 * question + i);
  return doc;
}

const std::vector<std::string> kCommon = {"-c", "512", "--prefill-chunk", "128", "--cache-record-stride", "64",
                                          "--runtime-lane-count", "1"};

json Complete(httplib::Client& c, const std::vector<int>& prompt) {
  json req = {{"prompt", prompt}, {"n_predict", 6}, {"temperature", 0}, {"ignore_eos", true},
              {"return_tokens", true}, {"n_probs", 2}};
  auto [status, body] = PostJson(c, "/completion", req);
  EXPECT_EQ(status, 200) << body.dump();
  return body;
}

json Stats(const ServerProcess& s, const std::string& key = "") {
  return json::parse(s.Client(key)->Get("/cache/stats")->body);
}

class SharedTierServing : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_ = RedisServer::Start();
    ASSERT_NE(redis_, nullptr);
    name_ = "skippy-shared-serving-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name_.begin(), name_.end(), '/', '_');
    password_file_ = fs::temp_directory_path() / (name_ + ".password");
    std::ofstream(password_file_) << RedisServer::kPassword << "\n";
  }
  void TearDown() override { fs::remove(password_file_); }

  std::vector<std::string> Flags(std::vector<std::string> extra, int port = 0) const {
    std::vector<std::string> f = kCommon;
    f.insert(f.end(), {"--shared-redis", "127.0.0.1:" + std::to_string(port ? port : redis_->port()),
                       "--shared-redis-password-file", password_file_.string(), "--shared-timeout-ms", "2000"});
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  }
  // Waits until a replica's writes to Redis are done.
  static void WaitWritten(const ServerProcess& s, const std::string& key = "") {
    for (int i = 0; i < 200; ++i) {
      const json shared = Stats(s, key)["shared"];
      if (shared.value("writes", 0) > 0 && shared.value("queued_bytes", 1) == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "the replica's shared-tier writes did not finish";
  }

  std::unique_ptr<RedisServer> redis_;
  std::string name_;
  fs::path password_file_;
};

class SharedTierFamilies : public SharedTierServing, public ::testing::WithParamInterface<std::string> {};

TEST_P(SharedTierFamilies, AReplicaServesWhatAnotherRecordedExactly) {
  const std::string family = GetParam();
  const auto docs = Documents(0x5a4e + static_cast<uint32_t>(family.size()), 3);
  auto a = ServerProcess::Start(family, Flags({}), name_ + "-a");
  ASSERT_TRUE(a);
  for (const auto& d : docs) Complete(*a->Client(), Ask(d, 0));
  WaitWritten(*a);
  auto b = ServerProcess::Start(family, Flags({}), name_ + "-b");
  auto off = ServerProcess::Start(family, kCommon, name_ + "-off");
  ASSERT_TRUE(b && off);
  EXPECT_GT(Stats(*b)["shared"].value("loaded_at_open", 0), 0);
  int shared_hits = 0;
  for (const auto& d : docs) {
    const auto prompt = Ask(d, 1);
    const json on = Complete(*b->Client(), prompt);
    const json ref = Complete(*off->Client(), prompt);
    EXPECT_EQ(on["tokens"], ref["tokens"]) << family << ": " << on["skippy"].dump();
    EXPECT_EQ(on["completion_probabilities"], ref["completion_probabilities"])
        << family << ": logits differ, " << on["skippy"].dump();
    shared_hits += on["skippy"].value("cache_tier", "") == "shared" ? 1 : 0;
  }
  const json stats = Stats(*b);
  EXPECT_EQ(shared_hits, 3) << stats.dump();
  EXPECT_EQ(stats["shared"]["hits"], stats["shared_hits"]) << stats.dump();
  EXPECT_EQ(stats["shared"].value("corrupt", -1), 0) << stats.dump();
  // /metrics carries the tier.
  const std::string metrics = b->Client()->Get("/metrics")->body;
  EXPECT_NE(metrics.find("skippy_shared_hits_total 3"), std::string::npos);
  EXPECT_NE(metrics.find("skippy_shared_connected 1"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Families, SharedTierFamilies, ::testing::Values("llama", "gemma3", "qwen3next"));

TEST_F(SharedTierServing, TenantsStayApartAcrossReplicas) {
  const auto docs = Documents(0x7e7, 1);
  const std::vector<std::string> keys = {"--api-key", "key-a:tenant-a", "--api-key", "key-b:tenant-b"};
  auto a = ServerProcess::Start("llama", Flags(keys), name_ + "-a");
  ASSERT_TRUE(a);
  Complete(*a->Client("key-a"), Ask(docs[0], 0));
  for (int i = 0; i < 100 && redis_->Keys("skippy:*:m:*").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto b = ServerProcess::Start("llama", Flags(keys), name_ + "-b");
  ASSERT_TRUE(b);
  const json other = Complete(*b->Client("key-b"), Ask(docs[0], 1));
  EXPECT_EQ(other["timings"].value("cache_n", -1), 0) << other.dump();
  EXPECT_EQ(other["skippy"].value("cache_tier", ""), "") << other["skippy"].dump();
  const json same = Complete(*b->Client("key-a"), Ask(docs[0], 2));
  EXPECT_EQ(same["skippy"].value("cache_tier", ""), "shared") << same["skippy"].dump();
}

TEST_F(SharedTierServing, RedisDownLeavesEveryRequestAnsweredExactly) {
  const auto docs = Documents(0xd0e, 2);
  auto on = ServerProcess::Start("llama", Flags({}), name_ + "-on");
  auto off = ServerProcess::Start("llama", kCommon, name_ + "-off");
  ASSERT_TRUE(on && off);
  Complete(*on->Client(), Ask(docs[0], 0));
  redis_->Kill();
  for (int q = 0; q < 3; ++q) {
    for (const auto& d : docs) {
      const json a = Complete(*on->Client(), Ask(d, q + 1));
      const json b = Complete(*off->Client(), Ask(d, q + 1));
      EXPECT_EQ(a["completion_probabilities"], b["completion_probabilities"]) << a["skippy"].dump();
    }
  }
  const json stats = Stats(*on);
  EXPECT_FALSE(stats["shared"].value("connected", true)) << stats.dump();
  EXPECT_TRUE(on->alive());
  // A replica starts with Redis down, and says so.
  auto late = ServerProcess::Start("llama", Flags({}), name_ + "-late");
  ASSERT_TRUE(late);
  EXPECT_EQ(Complete(*late->Client(), Ask(docs[1], 0)).value("tokens", json::array()).size(), 6u);
  EXPECT_NE(late->LogTail().find("does not answer"), std::string::npos) << late->LogTail();
}

// --one-row-class=auto measures at startup, and the class is in the entries' identity: replicas that
// decided apart would share nothing. The first replica proposes what it measured; the next takes it
// without measuring and serves the first one's entries. A decision planted in Redis (the opposite
// one) is taken as well, and answers as a --no-cache server pinned to it does.
TEST_F(SharedTierServing, ReplicasTakeTheClassDecisionTheFirstOneMeasured) {
  const auto docs = Documents(0xc1a55, 1);
  auto a = ServerProcess::Start("llama", Flags({"--one-row-class=auto"}), name_ + "-a");
  ASSERT_TRUE(a);
  const json first = Stats(*a)["one_row_class"];
  ASSERT_TRUE(first["measured"].contains("ratio")) << first.dump();
  EXPECT_FALSE(first.contains("kept")) << first.dump();
  const auto agreements = redis_->Keys("skippy:agree:*");
  ASSERT_EQ(agreements.size(), 1u);
  Complete(*a->Client(), Ask(docs[0], 0));
  WaitWritten(*a);

  auto b = ServerProcess::Start("llama", Flags({"--one-row-class=auto"}), name_ + "-b");
  ASSERT_TRUE(b);
  const json taken = Stats(*b)["one_row_class"];
  EXPECT_EQ(taken.value("kept_from", ""), "shared") << taken.dump();
  EXPECT_EQ(taken["on"], first["on"]);
  EXPECT_EQ(taken["measured"], first["measured"]) << "not measured again";
  EXPECT_EQ(Complete(*b->Client(), Ask(docs[0], 1))["skippy"].value("cache_tier", ""), "shared");

  const bool planted = !first["on"].get<bool>();
  ASSERT_EQ(redis_->Command({"SET", agreements[0], json{{"on", planted}, {"measured", {{"planted", true}}}}.dump()}),
            std::optional<std::string>("OK"));
  auto c = ServerProcess::Start("llama", Flags({"--one-row-class=auto"}), name_ + "-c");
  std::vector<std::string> ref_flags = kCommon;
  ref_flags.insert(ref_flags.end(), {"--no-cache", planted ? "--one-row-class=on" : "--one-row-class=off"});
  auto ref = ServerProcess::Start("llama", ref_flags, name_ + "-ref");
  ASSERT_TRUE(c && ref);
  const json cls = Stats(*c)["one_row_class"];
  EXPECT_EQ(cls["on"], planted) << cls.dump();
  EXPECT_EQ(cls["measured"], (json{{"planted", true}})) << cls.dump();
  for (int q = 2; q < 4; ++q) {
    const json x = Complete(*c->Client(), Ask(docs[0], q));
    const json y = Complete(*ref->Client(), Ask(docs[0], q));
    EXPECT_EQ(x["tokens"], y["tokens"]);
    EXPECT_EQ(x["completion_probabilities"], y["completion_probabilities"]) << x["skippy"].dump();
  }
}

TEST_F(SharedTierServing, ARefusedPasswordStopsTheServerWithAClearError) {
  std::ofstream(password_file_) << "not-the-password\n";
  const std::string log = (fs::temp_directory_path() / (name_ + ".log")).string();
  std::vector<std::string> argv = {skippy::server_test::ServerBin(), "-m", skippy::server_test::ZooFile("llama"),
                                   "--host", "127.0.0.1", "--port", std::to_string(*skippy::FreeLoopbackPort()),
                                   "-t", "1"};
  const auto flags = Flags({});
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto proc = skippy::Subprocess::Start(argv, log);
  ASSERT_TRUE(proc.ok());
  const std::optional<int> rc = proc->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(rc.has_value());
  EXPECT_NE(*rc, 0);
  const std::string tail = skippy::TailOfFile(log);
  EXPECT_NE(tail.find("refused the password"), std::string::npos) << tail;
}

}  // namespace
