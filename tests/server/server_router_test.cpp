// skippy-router over two skippy-server replicas (tiny llama) sharing a Redis tier: requests on a
// document go where its prefix is cached and answer exactly as a --no-cache server does; streams
// pass through; a replica killed mid-run leaves every request answered (retried or routed
// elsewhere) and counted; a stream whose replica dies before its first token is answered by
// another; a request refused by a replica comes back with the replica's error.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "../support/redis_server.h"
#include "server_process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using skippy::server_test::PostJson;
using skippy::server_test::ServerProcess;
using skippy::testing::RedisServer;

std::string RouterBin() { return skippy::server_test::Env("SKIPPY_ROUTER_BIN", SKIPPY_TEST_ROUTER_BIN); }

std::vector<int> Doc(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> v(std::uniform_int_distribution<int>(150, 220)(rng));
  for (int& t : v) t = std::uniform_int_distribution<int>(1000, 9000)(rng);
  return v;
}

std::vector<int> Ask(std::vector<int> doc, int q) {
  for (int i = 0; i < 10; ++i) doc.push_back(300 + 41 * q + i);
  return doc;
}

json Complete(httplib::Client& c, const std::vector<int>& prompt, int* status = nullptr) {
  json req = {{"prompt", prompt}, {"n_predict", 4}, {"temperature", 0}, {"ignore_eos", true},
              {"return_tokens", true}, {"n_probs", 2}};
  auto [st, body] = PostJson(c, "/completion", req);
  if (status) *status = st;
  return body;
}

class RouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_ = RedisServer::Start();
    ASSERT_NE(redis_, nullptr);
    tag_ = "skippy-router-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    password_file_ = fs::temp_directory_path() / (tag_ + ".password");
    std::ofstream(password_file_) << RedisServer::kPassword << "\n";
    const std::vector<std::string> flags = {"-c", "512", "--prefill-chunk", "128", "--runtime-lane-count", "1",
                                            "--shared-redis", "127.0.0.1:" + std::to_string(redis_->port()),
                                            "--shared-redis-password-file", password_file_.string(),
                                            "--shared-timeout-ms", "2000"};
    for (int i = 0; i < 2; ++i) {
      replicas_.push_back(ServerProcess::Start("llama", flags, tag_ + "-r" + std::to_string(i)));
      ASSERT_TRUE(replicas_.back());
    }
    port_ = *skippy::FreeLoopbackPort();
    log_ = (fs::temp_directory_path() / (tag_ + "-router.log")).string();
    auto proc = skippy::Subprocess::Start(
        {RouterBin(), "--port", std::to_string(port_), "--replica", "127.0.0.1:" + std::to_string(replicas_[0]->port()),
         "--replica", "127.0.0.1:" + std::to_string(replicas_[1]->port())},
        log_);
    ASSERT_TRUE(proc.ok()) << proc.status();
    router_ = std::make_unique<skippy::Subprocess>(std::move(*proc));
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 200; ++i) {
      auto r = c.Get("/router/stats");
      if (r && r->status == 200) {
        const json s = json::parse(r->body);
        bool ready = true;
        for (const json& rep : s["replicas"]) ready = ready && rep["healthy"] && rep["following_events"];
        if (ready) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "the router did not see its replicas; log:\n" << skippy::TailOfFile(log_);
  }
  void TearDown() override {
    if (router_) router_->Stop(std::chrono::milliseconds(3000));
    fs::remove(password_file_);
  }
  std::unique_ptr<httplib::Client> Client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60);
    return c;
  }
  json Stats() const { return json::parse(Client()->Get("/router/stats")->body); }

  std::unique_ptr<RedisServer> redis_;
  std::vector<std::unique_ptr<ServerProcess>> replicas_;
  std::unique_ptr<skippy::Subprocess> router_;
  int port_ = 0;
  std::string tag_, log_;
  fs::path password_file_;
};

TEST_F(RouterTest, RequestsGoWhereTheirPrefixIsAndAnswerExactly) {
  auto off = ServerProcess::Start("llama", {"-c", "512", "--prefill-chunk", "128", "--runtime-lane-count", "1"},
                                  tag_ + "-off");
  ASSERT_TRUE(off);
  auto c = Client();
  std::map<std::string, int> tiers;
  for (int q = 0; q < 3; ++q) {
    for (uint32_t d = 0; d < 4; ++d) {
      const auto prompt = Ask(Doc(0x40 + d), q);
      const json a = Complete(*c, prompt);
      const json b = Complete(*off->Client(), prompt);
      EXPECT_EQ(a["completion_probabilities"], b["completion_probabilities"]) << a["skippy"].dump();
      if (q > 0) ++tiers[a["skippy"].value("cache_tier", "")];
    }
  }
  const json s = Stats();
  int by_prefix = 0;
  for (const json& r : s["replicas"]) by_prefix += r["routed_by_prefix"].get<int>();
  // Every later question finds its document in the replica's RAM (lane or memory), not by a
  // detour through Redis and never by a recompute.
  EXPECT_EQ(tiers[""], 0) << s.dump();
  EXPECT_EQ(tiers["shared"], 0) << s.dump();
  EXPECT_GE(by_prefix, 8) << s.dump();
  // Both replicas got work.
  for (const json& r : s["replicas"]) EXPECT_GT(r["requests"].get<int>(), 0) << s.dump();
  const std::string metrics = c->Get("/metrics")->body;
  EXPECT_NE(metrics.find("skippy_router_requests_total{replica="), std::string::npos);
}

TEST_F(RouterTest, StreamsPassThroughAndErrorsComeBackAsTheReplicaSentThem) {
  auto c = Client();
  std::string got;
  httplib::Request req;
  auto r = c->Post("/v1/chat/completions",
                   json{{"messages", {{{"role", "user"}, {"content", "hello there"}}}}, {"max_tokens", 3}, {"stream", true}}
                       .dump(),
                   "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("data: "), std::string::npos);
  EXPECT_NE(r->body.find("[DONE]"), std::string::npos) << r->body;
  auto bad = c->Post("/v1/chat/completions", json{{"messages", 5}, {"stream", true}}.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_NE(bad->body.find("error"), std::string::npos);
}

TEST_F(RouterTest, AReplicaKilledMidRunLeavesEveryRequestAnswered) {
  auto c = Client();
  for (uint32_t d = 0; d < 4; ++d) Complete(*c, Ask(Doc(0x90 + d), 0));
  ::kill(replicas_[0]->pid(), SIGKILL);
  int ok = 0;
  for (int q = 1; q < 3; ++q) {
    for (uint32_t d = 0; d < 4; ++d) {
      int status = 0;
      Complete(*c, Ask(Doc(0x90 + d), q), &status);
      ok += status == 200 ? 1 : 0;
    }
  }
  EXPECT_EQ(ok, 8) << skippy::TailOfFile(log_);
  const json s = Stats();
  EXPECT_FALSE(s["replicas"][0]["healthy"].get<bool>()) << s.dump();
  EXPECT_EQ(s["unavailable"], 0) << s.dump();
}

TEST_F(RouterTest, AStreamCutMidWayEndsWithAnErrorEvent) {
  auto c = Client();
  std::string body;
  std::atomic<bool> killed{false};
  httplib::Request req;
  req.method = "POST";
  req.path = "/completion";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = json{{"prompt", "a stream that is cut"}, {"n_predict", 400}, {"ignore_eos", true}, {"stream", true}}.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    body.append(data, n);
    if (!killed && body.find("data: ") != std::string::npos) {
      killed = true;
      // The replica serving it is the one with a request in flight.
      const json stats = Stats();  // kept: the loop must not walk a destroyed temporary
      for (const json& r : stats["replicas"]) {
        if (r["in_flight"].get<int>() > 0) {
          for (auto& rep : replicas_) {
            if (r["replica"] == "127.0.0.1:" + std::to_string(rep->port())) ::kill(rep->pid(), SIGKILL);
          }
        }
      }
    }
    return true;
  };
  auto res = c->send(req);
  ASSERT_TRUE(res);
  EXPECT_TRUE(killed.load());
  EXPECT_NE(body.find("replica_failed"), std::string::npos) << body.substr(body.size() > 400 ? body.size() - 400 : 0);
  EXPECT_EQ(body.find("[DONE]"), std::string::npos);
  EXPECT_EQ(Stats()["streams_cut"], 1) << Stats().dump();
}

TEST_F(RouterTest, AClientThatLeavesCancelsTheGenerationOnItsReplica) {
  {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(std::chrono::milliseconds(200));  // then it hangs up
    auto r = c.Post("/completion", json{{"prompt", "nobody waits"}, {"n_predict", 480}, {"ignore_eos", true}}.dump(),
                    "application/json");
    EXPECT_FALSE(r);
  }
  // The router closes the replica's connection; the replica cancels and counts it.
  int cancelled = 0;
  for (int i = 0; i < 100 && cancelled == 0; ++i) {
    for (auto& rep : replicas_) {
      auto m = rep->Client()->Get("/metrics");
      if (m && m->body.find("skippy_requests_cancelled_total 0\n") == std::string::npos) ++cancelled;
    }
    if (cancelled == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(cancelled, 1);
  EXPECT_EQ(Stats()["client_gone"], 1) << Stats().dump();
  EXPECT_EQ(Stats()["retries"], 0) << Stats().dump();
}

TEST_F(RouterTest, SigtermDrainsTheStreamInFlightThenExits) {
  std::string body;
  std::atomic<bool> started{false};
  std::thread client([&] {
    auto c = Client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/completion";
    req.headers = {{"Content-Type", "application/json"}};
    req.body = json{{"prompt", "a stream that drains"}, {"n_predict", 300}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      started = true;
      return true;
    };
    (void)c->send(req);
  });
  for (int i = 0; i < 500 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(started.load());
  ::kill(router_->pid(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // New requests are refused while it drains (or find it gone).
  auto late = Client()->Post("/completion", json{{"prompt", "late"}, {"n_predict", 2}}.dump(), "application/json");
  if (late) {
    EXPECT_EQ(late->status, 503);
  }
  client.join();
  EXPECT_NE(body.find("\"stop\":true"), std::string::npos) << body.substr(body.size() > 300 ? body.size() - 300 : 0);
  const std::optional<int> rc = router_->Wait(std::chrono::seconds(5));
  ASSERT_TRUE(rc.has_value()) << "the router did not exit after draining";
  EXPECT_EQ(*rc, 0);
}

}  // namespace

namespace {

// A replica that answers its health check and starts every stream (headers, then a keepalive or
// the chat role chunk) but dies before the first token, as a replica killed in a prefill does.
// Whether every replica of the router on `port` passed a health check (within 5 s).
bool AllHealthy(int port) {
  httplib::Client c("127.0.0.1", port);
  for (int i = 0; i < 200; ++i) {
    auto r = c.Get("/router/stats");
    if (r && r->status == 200) {
      const json s = json::parse(r->body);
      bool ok = !s["replicas"].empty();
      for (const json& rep : s["replicas"]) ok = ok && rep["healthy"].get<bool>();
      if (ok) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

// A log file for one test's router, in the temporary directory.
std::string RouterLog(const std::string& tag) {
  return (fs::temp_directory_path() / ("skippy-router-" + tag + "-" + std::to_string(::getpid()) + ".log")).string();
}

std::unique_ptr<skippy::Subprocess> StartRouter(const std::vector<std::string>& args, const std::string& log,
                                                int* port) {
  *port = *skippy::FreeLoopbackPort();
  std::vector<std::string> argv = {RouterBin(), "--port", std::to_string(*port)};
  argv.insert(argv.end(), args.begin(), args.end());
  auto proc = skippy::Subprocess::Start(argv, log);
  if (!proc.ok()) return nullptr;
  return std::make_unique<skippy::Subprocess>(std::move(*proc));
}

// A stand-in replica: an httplib server on a free loopback port that answers /health; a subclass
// adds its routes in its constructor, then calls Listen(), and calls Stop() in its destructor
// (its handlers use its members).
class FakeReplica {
 public:
  FakeReplica() {
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
  }
  virtual ~FakeReplica() { Stop(); }
  int port() const { return port_; }

 protected:
  void Listen() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Server server_;

 private:
  std::thread thread_;
  int port_ = 0;
};

class DiesInPrefill : public FakeReplica {
 public:
  DiesInPrefill() {
    auto start = [this](bool chat) {
      return [this, chat](const httplib::Request&, httplib::Response& res) {
        ++(chat ? chat_hits_ : completion_hits_);
        res.set_chunked_content_provider("text/event-stream", [chat](size_t, httplib::DataSink& sink) {
          const std::string first =
              chat ? R"(data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})"
                     "\n\n"
                   : ": ping\n\n";
          sink.write(first.data(), first.size());
          return false;  // the connection drops without the stream's end
        });
      };
    };
    server_.Post("/completion", start(false));
    server_.Post("/v1/chat/completions", start(true));
    Listen();
  }
  ~DiesInPrefill() override { Stop(); }
  int completion_hits() const { return completion_hits_; }
  int chat_hits() const { return chat_hits_; }

 private:
  std::atomic<int> completion_hits_{0}, chat_hits_{0};
};

TEST(RouterRetry, AStreamWhoseReplicaDiesBeforeItsFirstTokenIsAnsweredByAnother) {
  auto real = ServerProcess::Start("llama", {"-c", "512", "--runtime-lane-count", "1"}, "router-retry");
  ASSERT_TRUE(real);
  DiesInPrefill fake;
  ASSERT_GT(fake.port(), 0);
  const std::string log = RouterLog("retry");
  int port = 0;
  auto router = StartRouter({"--policy", "round-robin", "--replica", "127.0.0.1:" + std::to_string(fake.port()),
                             "--replica", "127.0.0.1:" + std::to_string(real->port())},
                            log, &port);
  ASSERT_TRUE(router);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  // Round-robin deals every other request to the failing replica while it looks healthy.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(AllHealthy(port)) << skippy::TailOfFile(log);
    auto r = c.Post("/completion",
                    json{{"prompt", "held until its first token"}, {"n_predict", 3}, {"stream", true}}.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("\"stop\":true"), std::string::npos) << r->body;
    EXPECT_EQ(r->body.find("replica_failed"), std::string::npos) << r->body;
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(AllHealthy(port)) << skippy::TailOfFile(log);
    auto r = c.Post("/v1/chat/completions",
                    json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3}, {"stream", true}}
                        .dump(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("[DONE]"), std::string::npos) << r->body;
    // One role chunk: the dead replica's was never passed on.
    size_t roles = 0;
    for (size_t at = 0; (at = r->body.find("\"role\":\"assistant\"", at)) != std::string::npos; ++at) ++roles;
    EXPECT_EQ(roles, 1u) << r->body;
  }
  EXPECT_GE(fake.completion_hits(), 1);
  EXPECT_GE(fake.chat_hits(), 1);
  const json s = json::parse(c.Get("/router/stats")->body);
  EXPECT_EQ(s["streams_cut"], 0) << s.dump();
  EXPECT_EQ(s["retries"], fake.completion_hits() + fake.chat_hits()) << s.dump();
  router->Stop(std::chrono::milliseconds(3000));
}

// A replica that is always busy (503 with Retry-After on every generation) and whose event
// stream sends frames of shapes no skippy-server writes.
class BusyWithOddEvents : public FakeReplica {
 public:
  BusyWithOddEvents() {
    server_.Get("/cache/events", [this](const httplib::Request&, httplib::Response& res) {
      ++event_streams_;
      res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
        const std::string frames = "data: {\"kind\":1}\n\ndata: {\"kind\":\"hello\",\"lanes\":\"many\"}\n\n"
                                   "data: [1,2]\n\ndata: {\"kind\":\"hello\",\"lanes\":null}\n\ndata: not json\n\n";
        sink.write(frames.data(), frames.size());
        return false;
      });
    });
    auto busy = [this](const httplib::Request&, httplib::Response& res) {
      ++generations_;
      res.status = 503;
      res.set_header("Retry-After", "7");
      res.set_content(R"({"error":{"message":"all lanes are busy","type":"server_error","code":"queue_full"}})",
                      "application/json");
    };
    server_.Post("/completion", busy);
    server_.Post("/v1/chat/completions", busy);
    // Answers only after the router's read timeout (1 s in the test that asks).
    server_.Post("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      res.set_content("{}", "application/json");
    });
    Listen();
  }
  ~BusyWithOddEvents() override { Stop(); }
  int generations() const { return generations_; }
  int event_streams() const { return event_streams_; }

 private:
  std::atomic<int> generations_{0}, event_streams_{0};
};

TEST(RouterRetry, ARequestABusyReplicaRefusesGoesToAnother) {
  constexpr const char* kKey = "router-key";
  auto real = ServerProcess::Start("llama", {"-c", "512", "--runtime-lane-count", "1", "--api-key", kKey},
                                   "router-busy");
  ASSERT_TRUE(real);
  BusyWithOddEvents busy;
  ASSERT_GT(busy.port(), 0);
  const std::string log = RouterLog("busy");
  int port = 0;
  auto router = StartRouter({"--policy", "round-robin", "--replica", "127.0.0.1:" + std::to_string(busy.port()),
                             "--replica", "127.0.0.1:" + std::to_string(real->port())},
                            log, &port);
  ASSERT_TRUE(router);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  // The key in the header OpenAI's clients may send it in; "stream": null is no stream.
  c.set_default_headers({{"X-Api-Key", kKey}});
  const json bodies[] = {
      {{"prompt", "sent on"}, {"n_predict", 2}},
      {{"prompt", "sent on"}, {"n_predict", 2}, {"stream", nullptr}},
      {{"prompt", "sent on"}, {"n_predict", 2}, {"stream", true}},
      {{"prompt", "sent on"}, {"n_predict", 2}, {"stream", true}},
  };
  for (const json& b : bodies) {
    ASSERT_TRUE(AllHealthy(port)) << skippy::TailOfFile(log);
    auto r = c.Post("/completion", b.dump(), "application/json");
    ASSERT_TRUE(r) << skippy::TailOfFile(log);
    EXPECT_EQ(r->status, 200) << b.dump() << ": " << r->body;
  }
  EXPECT_GE(busy.generations(), 1) << "round-robin never dealt a request to the busy replica";
  const json s = json::parse(c.Get("/router/stats")->body);
  EXPECT_EQ(s["busy_replicas"], busy.generations()) << s.dump();
  EXPECT_EQ(s["unavailable"], 0) << s.dump();
  router->Stop(std::chrono::milliseconds(3000));

  // With only the busy replica, the client gets its 503 and Retry-After.
  auto alone = StartRouter({"--policy", "round-robin", "--replica", "127.0.0.1:" + std::to_string(busy.port())},
                           log + ".alone", &port);
  ASSERT_TRUE(alone);
  httplib::Client a("127.0.0.1", port);
  for (bool stream : {false, true}) {
    ASSERT_TRUE(AllHealthy(port)) << skippy::TailOfFile(log + ".alone");
    auto r = a.Post("/completion", json{{"prompt", "x"}, {"n_predict", 1}, {"stream", stream}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_EQ(r->get_header_value("Retry-After"), "7");
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full") << r->body;
  }
  alone->Stop(std::chrono::milliseconds(3000));
}

TEST(RouterTimeout, AnAnswerLongerThanTheReadTimeoutIsA504) {
  BusyWithOddEvents slow;
  ASSERT_GT(slow.port(), 0);
  const std::string log = RouterLog("slow");
  int port = 0;
  auto router = StartRouter({"--policy", "round-robin", "--read-timeout-secs", "1", "--replica",
                             "127.0.0.1:" + std::to_string(slow.port())},
                            log, &port);
  ASSERT_TRUE(router);
  ASSERT_TRUE(AllHealthy(port)) << skippy::TailOfFile(log);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30);
  auto r = c.Post("/v1/completions", json{{"prompt", "slow"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "replica_timeout") << r->body;
  const json s = json::parse(c.Get("/router/stats")->body);
  EXPECT_EQ(s["timeouts"], 1) << s.dump();
  EXPECT_EQ(s["retries"], 0) << "a generation that long is not sent again: " << s.dump();
  router->Stop(std::chrono::milliseconds(3000));
}

TEST(RouterEvents, EventsOfAnotherShapeLeaveTheRouterRunning) {
  BusyWithOddEvents odd;
  ASSERT_GT(odd.port(), 0);
  const std::string log = RouterLog("odd");
  int port = 0;
  auto router = StartRouter({"--replica", "127.0.0.1:" + std::to_string(odd.port())}, log, &port);
  ASSERT_TRUE(router);
  httplib::Client c("127.0.0.1", port);
  // The router follows the stream again after each end: a few rounds of the odd frames.
  for (int i = 0; i < 400 && odd.event_streams() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  EXPECT_GE(odd.event_streams(), 3);
  auto r = c.Get("/router/stats");
  ASSERT_TRUE(r) << "the router died on an event; log:\n" << skippy::TailOfFile(log);
  EXPECT_EQ(r->status, 200);
  router->Stop(std::chrono::milliseconds(3000));
}

}  // namespace
