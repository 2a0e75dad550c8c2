// skippy-server under hostile input (label hardening): a matrix of more than 500 bad requests,
// each a 4xx with an error body, while /health keeps answering within a second and the server's
// memory stays flat; metrics that no request can grow or write into; request envelopes refused
// before their body is read; chats refused before they are rendered; a shutdown that a trickling
// client cannot hold up; a port already in use refused at startup. One tiny llama server for the
// suite, two lanes, two API keys.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "server_process.h"

namespace {

using nlohmann::json;
using skippy::StrCat;
using skippy::server_test::PostJson;
using skippy::server_test::ServerProcess;

constexpr const char* kKey = "admin-key";
constexpr const char* kTenantKey = "tenant-key";

long RssKib(pid_t pid) {
  std::ifstream f(StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// A TCP connection to the server on loopback, with a receive timeout when timeout_s > 0; -1 when
// it cannot connect.
int ConnectLoopback(int port, int timeout_s = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (timeout_s > 0) {
    timeval tv{timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A raw request on a fresh socket: what a client library would never send. Returns the status
// line's code (0: no answer before the timeout or the connection closed without one).
int RawStatus(int port, const std::string& request, int timeout_s = 5) {
  const int fd = ConnectLoopback(port, timeout_s);
  if (fd < 0) return 0;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  char buf[256] = {0};
  const ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  close(fd);
  if (n < 12 || std::string(buf, 5) != "HTTP/") return 0;
  return std::atoi(buf + 9);
}

class Hardening : public skippy::server_test::SharedServer<Hardening> {
 protected:
  static void SetUpTestSuite() {
    StartShared({"-c", "512", "-np", "2", "--api-key", kKey, "--api-key", std::string(kTenantKey) + ":tenant-b",
                 "--max-body-bytes", "65536"},
                "hardening");
  }

  // /health answers (no key needed) within a second.
  static bool HealthyWithinASecond() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_connection_timeout(1);
    c.set_read_timeout(1);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Get("/health");
    return r && r->status == 200 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1);
  }
};

struct BadRequest {
  std::string name, path, body;
};

// Invalid values for each field of a generation request, by the field's kind.
std::vector<BadRequest> FieldMutations() {
  const std::vector<json> not_int = {"8", 1.5, true, json::array(), json::object(), 1e20};
  const std::vector<json> not_number = {"0.5", true, json::array(), json::object()};
  const std::vector<json> not_string = {1, true, json::array({"x"}), json::object()};
  const std::vector<json> not_bool = {"true", 1, json::array(), json::object()};
  struct Field {
    std::string name;
    std::vector<json> bad;
  };
  auto plus = [](std::vector<json> v, std::initializer_list<json> more) {
    v.insert(v.end(), more);
    return v;
  };
  const std::vector<Field> common = {
      {"temperature", plus(not_number, {-1, 101, 1e-39, 1e-7})},
      {"top_p", plus(not_number, {-0.5, 1.5, -1e-320})},
      {"min_p", plus(not_number, {-0.1, 2})},
      {"top_k", plus(not_int, {-5})},
      {"seed", plus(not_int, {-2, 1e10})},
      {"stream", not_bool},
      {"stream_options", {"x", 1, json::array(), json{{"include_usage", "yes"}}}},
      {"stop", {1, json::array({1}), json::array({""}), json(std::vector<std::string>(17, "x")), json::object()}},
      {"cache_salt", not_string},
      {"model", not_string},
      {"ignore_eos", not_bool},
      {"return_tokens", not_bool},
      {"n", {2, 0, "1", -1}},
      {"presence_penalty", plus(not_number, {2.5, -3, 1e300})},
      {"frequency_penalty", plus(not_number, {-2.5, 3})},
      {"repeat_penalty", plus(not_number, {0, -1, 11, 1e-39})},
      {"repeat_last_n", plus(not_int, {-1, 1 << 21})},
      {"cache_prompt", not_bool},
      {"user", not_string},
      {"grammar", plus(not_string, {"root ::= (", "root ::= root \"a\"", "x ::= \"a\"", "root ::= \"a\"{5000}"})},
      {"json_schema", {"{}", 1, true, json::array(), json{{"$ref", "#/nowhere"}}}},
      {"logit_bias", {"x", 1, true, json{{"a", 1}}, json{{"5", 1e9}}, json{{"-1", 1}}, json{{"5", "x"}}, json{{"5", true}},
                      json::array({1}), json::array({json::array({1, 2, 3})}), json::array({json::array({"a", 1})}),
                      json{{"2147483648", 1}}, json{{"1000000000", 1}}}},
  };
  struct Endpoint {
    std::string path;
    json base;
    std::vector<Field> own;
  };
  const std::vector<Endpoint> endpoints = {
      {"/completion", {{"prompt", "hello"}, {"n_predict", 1}},
       {{"n_predict", plus(not_int, {-2, 100000})}, {"n_probs", plus(not_int, {-1, 21})},
        {"prompt", {1, true, json::object(), json::array(), json::array({-1}), json::array({"a", "b"})}},
        {"id_slot", not_int}, {"t_max_predict_ms", not_int}}},
      {"/v1/completions", {{"prompt", "hello"}, {"max_tokens", 1}},
       {{"max_tokens", plus(not_int, {-1, 100000})}, {"echo", {true, "x"}}, {"suffix", {"tail", 1}},
        {"best_of", {2, "1"}}, {"logprobs", {1, 5, "x"}},
        {"prompt", {1, true, json::object(), json::array(), json::array({json::array({1}), json::array({2})})}}}},
      {"/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "hello"}}})}, {"max_tokens", 1}},
       {{"max_tokens", plus(not_int, {-1, 100000})}, {"max_completion_tokens", plus(not_int, {-3})},
        {"logprobs", {"x", 1.5, json::array()}}, {"top_logprobs", {-1, 21, "2", 3}},
        {"response_format", {"text", 1, json::object(), json{{"type", "xml"}}, json{{"type", "json_schema"}, {"json_schema", "x"}},
                             json{{"type", "json_object"}, {"schema", 5}}}},
        {"messages", {"hi", 1, json::array(), json::array({1}), json::array({{{"role", ""}, {"content", "x"}}}),
                      json::array({{{"role", "user"}, {"content", 1}}}),
                      json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}}),
                      json::array({{{"role", "user"}, {"content", "x"}, {"name2", "y"}}})}}}},
  };
  // The llama-server aliases take the same bodies.
  std::vector<Endpoint> all = endpoints;
  all.push_back(endpoints[0]);
  all.back().path = "/completions";
  all.push_back(endpoints[2]);
  all.back().path = "/chat/completions";
  std::vector<BadRequest> out;
  for (const Endpoint& e : all) {
    std::vector<Field> fields = common;
    fields.insert(fields.end(), e.own.begin(), e.own.end());
    for (const Field& f : fields) {
      for (const json& v : f.bad) {
        json body = e.base;
        body[f.name] = v;
        out.push_back({StrCat(e.path, " ", f.name, "=", v.dump()), e.path, body.dump()});
      }
    }
    for (const char* typo : {"max_token", "temprature", "prompts", "stream_option", "n_predicts"}) {
      json body = e.base;
      body[typo] = 1;
      out.push_back({StrCat(e.path, " unknown ", typo), e.path, body.dump()});
    }
  }
  return out;
}

// Bodies that are not a request at all, on every endpoint that takes one.
std::vector<BadRequest> BrokenBodies() {
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  const std::vector<std::string> bodies = {
      "", "{", "}", "[]", "null", "1", "\"x\"", "{\"prompt\": }", "{'prompt': 'x'}", "{\"prompt\": \"x\",}",
      "\xff\xfe", deep, "{\"prompt\":" + deep + "}", std::string(70000, ' '), "{\"prompt\":\"x\"} trailing",
  };
  std::vector<BadRequest> out;
  for (const char* path : {"/completion", "/v1/completions", "/v1/chat/completions", "/apply-template", "/completions",
                           "/chat/completions"}) {
    for (size_t i = 0; i < bodies.size(); ++i) out.push_back({StrCat(path, " broken body ", i), path, bodies[i]});
  }
  return out;
}

TEST_F(Hardening, FiveHundredBadRequestsAreEach4xxAndLeaveTheServerAsItWas) {
  std::vector<BadRequest> cases = FieldMutations();
  const std::vector<BadRequest> broken = BrokenBodies();
  cases.insert(cases.end(), broken.begin(), broken.end());
  ASSERT_GE(cases.size(), 500u);
  auto c = server_->Client(kKey);
  // Warm up the allocator with the same kinds of requests before measuring.
  for (size_t i = 0; i < 50; ++i) (void)c->Post(cases[i].path, cases[i].body, "application/json");
  const long rss_before = RssKib(server_->pid());
  std::map<int, int> by_status;
  for (size_t i = 0; i < cases.size(); ++i) {
    const BadRequest& k = cases[i];
    auto r = c->Post(k.path, k.body, "application/json");
    ASSERT_TRUE(r) << k.name;
    ++by_status[r->status];
    EXPECT_GE(r->status, 400) << k.name << ": " << r->body;
    EXPECT_LT(r->status, 500) << k.name << ": " << r->body;
    const json body = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(body.is_object() && body.contains("error")) << k.name << ": " << r->body;
    if (i % 100 == 0) {
      EXPECT_TRUE(HealthyWithinASecond()) << "after " << i << " bad requests";
    }
  }
  const long rss_after = RssKib(server_->pid());
  std::printf("%zu bad requests: RSS %ld -> %ld KiB\n", cases.size(), rss_before, rss_after);
#if !defined(__SANITIZE_ADDRESS__)
  // (AddressSanitizer quarantines freed memory, so RSS says nothing about leaks in that build.)
  EXPECT_LT(rss_after - rss_before, 10 * 1024) << "RSS " << rss_before << " -> " << rss_after << " KiB";
#endif
  auto [s, ok] = PostJson(*c, "/completion", {{"prompt", "still serving"}, {"n_predict", 2}});
  EXPECT_EQ(s, 200) << ok.dump();
  const json st = json::parse(c->Get("/cache/stats")->body);
  EXPECT_EQ(st["lanes_busy"], 0);
  EXPECT_EQ(st["queue_depth"], 0);
}

TEST_F(Hardening, RandomPathsNeitherGrowNorWriteIntoTheMetrics) {
  auto admin = server_->Client(kKey);
  auto anon = server_->Client();
  const size_t before = admin->Get("/metrics")->body.size();
  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const std::string path = StrCat("/", i, "-", std::string(200 + rng() % 2000, 'p'));
    auto r = anon->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  // A path that tries to close the label and write a metric of its own.
  (void)anon->Get("/x%22%2Cstatus%3D%22200%22%7D%201e9%0Afake_admin_metric%7Bx%3D%22");
  const std::string after = admin->Get("/metrics")->body;
  EXPECT_LT(after.size(), 2 * before) << before << " -> " << after.size() << " bytes";
  EXPECT_EQ(after.find("fake_admin_metric"), std::string::npos);
  EXPECT_NE(after.find("endpoint=\"other\""), std::string::npos);
}

TEST_F(Hardening, EnvelopesAreRefusedBeforeTheBodyIsRead) {
  const int port = server_->port();
  const std::string auth = StrCat("Authorization: Bearer ", kKey, "\r\n");
  const std::string head = StrCat("POST /completion HTTP/1.1\r\nHost: x\r\n", auth,
                                  "Content-Type: application/json\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  // Impossible lengths: answered at once, without waiting for a body that never comes.
  EXPECT_EQ(RawStatus(port, head + "Content-Length: 1000000000000\r\n\r\n"), 413);
  EXPECT_EQ(RawStatus(port, head + "Content-Length: 18446744073709551616\r\n\r\n"), 400);
  EXPECT_EQ(RawStatus(port, head + "Content-Length: -5\r\n\r\n"), 400);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  // A chunked body is refused whatever it holds (its size is not known before reading it).
  EXPECT_EQ(RawStatus(port, head + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), 411);
  // Too many headers.
  std::string many = "GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth;
  for (int i = 0; i < 300; ++i) many += StrCat("X-Pad-", i, ": ", std::string(100, 'h'), "\r\n");
  EXPECT_EQ(RawStatus(port, many + "\r\n"), 431);
  // A byte range of a dynamic response is ignored: the whole answer, 200.
  auto admin = server_->Client(kKey);
  std::string ranges = "bytes=-1";
  for (int i = 0; i < 200; ++i) ranges += ",-1";
  auto r = admin->Get("/metrics", httplib::Headers{{"Range", ranges}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(HealthyWithinASecond());
}

TEST_F(Hardening, LongChatsAreRefusedBeforeRendering) {
  auto c = server_->Client(kKey);
  for (int n : {1000, 10000}) {
    json messages = json::array();
    for (int i = 0; i < n; ++i) messages.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "hi"}});
    const auto t0 = std::chrono::steady_clock::now();
    auto [s, r] = PostJson(*c, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 1}});
    // Refused by a limit before anything is rendered: the message count, or the body size first.
    const std::string code = r["error"].value("code", "");
    EXPECT_TRUE((s == 400 && code == "too_many_messages") || (s == 413 && code == "body_too_large"))
        << n << " messages: " << s << " " << r.dump();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << n << " messages";
  }
}

TEST_F(Hardening, AStreamIsValidatedBeforeItsFirstByte) {
  auto c = server_->Client(kKey);
  for (const char* path : {"/completion", "/v1/completions"}) {
    auto [s, r] = PostJson(*c, path, {{"prompt", "x"}, {"stream", true}, {"top_p", 1.5}, {"max_tokens", 1}});
    EXPECT_EQ(s, 400) << path << ": " << r.dump();
  }
  auto [s, r] = PostJson(*c, "/v1/chat/completions",
                         {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}, {"stream", true},
                          {"top_p", 1.5}});
  EXPECT_EQ(s, 400) << r.dump();
}

// HTTP/1.1 pipelining: requests written back to back in one packet are all answered, in order,
// without waiting for the keep-alive timeout (5 s), including a POST with a body between two GETs.
TEST_F(Hardening, PipelinedRequestsAreAnsweredInOrder) {
  const int fd = ConnectLoopback(server_->port(), 2);
  ASSERT_GE(fd, 0);
  const std::string body = json{{"prompt", "pipelined"}, {"n_predict", 1}, {"temperature", 0}}.dump();
  const std::string auth = StrCat("Authorization: Bearer ", kKey, "\r\n");
  const std::string requests =
      StrCat("GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
             "POST /completion HTTP/1.1\r\nHost: x\r\n", auth, "Content-Type: application/json\r\nContent-Length: ",
             body.size(), "\r\n\r\n", body,
             "GET /v1/models HTTP/1.1\r\nHost: x\r\n", auth, "\r\n");
  ASSERT_EQ(send(fd, requests.data(), requests.size(), MSG_NOSIGNAL), static_cast<ssize_t>(requests.size()));
  const auto t0 = std::chrono::steady_clock::now();
  std::string got;
  char buf[4096];
  while (got.find("\"object\":\"list\"") == std::string::npos) {  // the /v1/models body, last
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  close(fd);
  const size_t health = got.find("{\"status\":\"ok\"}");
  const size_t completion = got.find("\"content\"");
  const size_t models = got.find("\"object\":\"list\"");
  ASSERT_NE(models, std::string::npos) << "the third request was not answered: " << got;
  EXPECT_LT(health, completion) << got;
  EXPECT_LT(completion, models) << got;
  EXPECT_LT(waited, std::chrono::seconds(2)) << "answers waited for the keep-alive timeout";
  EXPECT_TRUE(HealthyWithinASecond());
}

// SIGTERM ends the process within --drain-seconds even while a client trickles a request.
TEST(HardeningShutdown, ATricklingClientCannotHoldUpShutdown) {
  auto server = ServerProcess::Start("llama", {"-c", "256", "--drain-seconds", "2"}, "hardening-drain");
  ASSERT_NE(server, nullptr);
  const int fd = ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  const std::string start = "GET /v1/models HTTP/1.1\r\nHost: x\r\n";
  ASSERT_GT(send(fd, start.data(), start.size(), MSG_NOSIGNAL), 0);
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int i = 0; !stop && i < 40; ++i) {
      const std::string h = StrCat("X-Slow-", i, ": 1\r\n");
      (void)send(fd, h.data(), h.size(), MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  bool exited = false;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8)) {
    if (!server->alive()) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  trickle.join();
  close(fd);
  EXPECT_TRUE(exited) << "still running 8 s after SIGTERM; log:\n" << server->LogTail();
}

// A second server on a port already in use stops with a clear error: it neither shares the port
// (SO_REUSEPORT would let the kernel split connections between the two) nor disturbs the first.
TEST(HardeningStartup, APortInUseIsRefused) {
  auto first = ServerProcess::Start("llama", {"-c", "256"}, "hardening-port-first");
  ASSERT_NE(first, nullptr);
  const std::string log = StrCat(std::filesystem::temp_directory_path().string(), "/skippy-hardening-port-",
                                 getpid(), ".log");
  auto second = skippy::Subprocess::Start({skippy::server_test::ServerBin(), "-m",
                                           skippy::server_test::ZooFile("llama"), "--host", "127.0.0.1", "--port",
                                           std::to_string(first->port()), "-t", "1", "-c", "256"},
                                          log);
  ASSERT_TRUE(second.ok()) << second.status();
  const std::optional<int> rc = second->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(rc.has_value()) << "the second server is still running; log:\n" << skippy::TailOfFile(log);
  EXPECT_NE(*rc, 0);
  EXPECT_NE(skippy::TailOfFile(log).find(StrCat("cannot listen on 127.0.0.1:", first->port())), std::string::npos)
      << skippy::TailOfFile(log);
  std::filesystem::remove(log);
  auto r = first->Client()->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

}  // namespace

namespace {

// 32 clients each sending a request one byte a second hold 32 connections; with four workers
// always running, the pool grows for them, and /health and a completion still answer at once.
TEST(HardeningSlowClients, ThirtyTwoSlowConnectionsStopNeitherHealthNorARequest) {
  auto server = ServerProcess::Start("llama", {"-c", "256", "--http-threads", "4"}, "hardening-slow");
  ASSERT_NE(server, nullptr);
  std::vector<int> fds;
  for (int i = 0; i < 32; ++i) {
    const int fd = ConnectLoopback(server->port());
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  const std::string request = "GET /v1/models HTTP/1.1\r\nHost: slow\r\nX-Pad: " + std::string(64, 'p') + "\r\n\r\n";
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (size_t at = 0; !stop && at < request.size(); ++at) {
      for (int fd : fds) (void)send(fd, request.data() + at, 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // every slow connection is in
  auto c = server->Client();
  c->set_connection_timeout(1);
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = c->Get("/health");
    EXPECT_TRUE(h && h->status == 200) << "round " << round << "; log:\n" << server->LogTail();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    auto [s, r] = PostJson(*c, "/completion", {{"prompt", "beside the slow ones"}, {"n_predict", 4}});
    EXPECT_EQ(s, 200) << r.dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  stop = true;
  trickle.join();
  for (int fd : fds) close(fd);
}

// The read timeout bounds a request's head as a whole: a client that sends a header line every
// half second, each well within --io-timeout, is answered 400 and closed once the head has taken
// longer than the timeout in all, instead of holding its thread for as long as it trickles.
TEST(HardeningSlowClients, ATricklingHeadIsCutAtTheReadTimeout) {
  auto server = ServerProcess::Start("llama", {"-c", "256", "--io-timeout", "2"}, "hardening-head");
  ASSERT_NE(server, nullptr);
  const int fd = ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string start = "GET /v1/models HTTP/1.1\r\nHost: x\r\n";
  ASSERT_GT(send(fd, start.data(), start.size(), MSG_NOSIGNAL), 0);
  std::atomic<bool> answered{false};
  std::string got;
  std::thread reader([&] {
    char buf[512];
    for (;;) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    answered = true;  // the server closed the connection
  });
  double closed_after_s = -1;
  for (int i = 0; i < 24 && !answered; ++i) {  // up to 12 s of header lines
    const std::string h = StrCat("X-Slow-", i, ": 1\r\n");
    (void)send(fd, h.data(), h.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (answered) closed_after_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  shutdown(fd, SHUT_RDWR);
  reader.join();
  close(fd);
  ASSERT_GE(closed_after_s, 0) << "the connection was still open after 12 s of trickled headers";
  EXPECT_GE(closed_after_s, 1.5);
  EXPECT_LT(closed_after_s, 5.0);
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  auto c = server->Client();
  auto h = c->Get("/health");
  EXPECT_TRUE(h && h->status == 200);
}

}  // namespace

namespace {

// With the message limit raised, a long chat costs time linear in its messages: 1,000 of them are
// rendered, tokenized and refused for the context (or rendered by /apply-template) in well under a
// second, where rendering and tokenizing every message prefix took about 30 s.
TEST(HardeningLongChat, AThousandMessagesAreRenderedInLinearTime) {
  auto server = ServerProcess::Start("llama", {"-c", "1024", "--max-messages", "5000"}, "hardening-chat");
  ASSERT_NE(server, nullptr);
  auto c = server->Client();
  json messages = json::array();
  for (int i = 0; i < 1000; ++i) {
    messages.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", StrCat("message ", i, " says hello")}});
  }
  for (const char* path : {"/v1/chat/completions", "/apply-template"}) {
    json body = {{"messages", messages}};
    if (std::string(path) != "/apply-template") body["max_tokens"] = 1;
    const auto t0 = std::chrono::steady_clock::now();
    auto [s, r] = PostJson(*c, path, body);
    const auto took = std::chrono::steady_clock::now() - t0;
    if (std::string(path) == "/apply-template") {
      EXPECT_EQ(s, 200) << r.dump();
    } else {
      EXPECT_EQ(s, 400) << r.dump();  // about 12,000 tokens: over the 1,024-token context
      EXPECT_NE(r.dump().find("context"), std::string::npos) << r.dump();
    }
#if defined(__SANITIZE_ADDRESS__)
    // The sanitizer build instruments the Jinja engine too and runs it about ten times slower
    // (2.2 s for the chat); quadratic rendering took 30 s in the plain build.
    EXPECT_LT(took, std::chrono::seconds(6)) << path;
#else
    EXPECT_LT(took, std::chrono::seconds(1)) << path;
#endif
  }
}

TEST(HardeningLongPrompt, ATextTooLongForTheContextIsRefusedBeforeItIsTokenized) {
  auto server = ServerProcess::Start("llama", {"-c", "64"}, "hardening-long-prompt");
  ASSERT_NE(server, nullptr);
  auto c = server->Client();
  std::string text;
  while (text.size() < (2u << 20)) text += "a long prompt nobody can serve in 64 tokens ";
  const json requests[] = {
      {{"prompt", text}, {"n_predict", 1}},
      {{"messages", json::array({{{"role", "user"}, {"content", text}}})}, {"max_tokens", 1}},
  };
  const char* paths[] = {"/completion", "/v1/chat/completions"};
  for (int i = 0; i < 2; ++i) {
    auto [s, r] = PostJson(*c, paths[i], requests[i]);
    EXPECT_EQ(s, 400) << paths[i];
    EXPECT_EQ(r["error"].value("code", ""), "context_length_exceeded") << r.dump();
    // Refused on its bytes, before the tokenizer ran.
    EXPECT_NE(r["error"].value("message", "").find("bytes"), std::string::npos) << r.dump();
  }
  // A prompt that fits is served as before.
  auto [s, r] = PostJson(*c, "/completion", {{"prompt", "a short prompt"}, {"n_predict", 2}});
  EXPECT_EQ(s, 200) << r.dump();
}

}  // namespace
