// A skippy-server child process on a free loopback port, for tests: started with
// skippy::Subprocess, healthy (GET /health == 200) before Start returns, stopped on destruction.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "httplib.h"
#include "nlohmann/json.hpp"
#include "skippy/common/strings.h"
#include "skippy/common/subprocess.h"

namespace skippy::server_test {

inline std::string Env(const char* name, const char* fallback) {
  if (const char* v = std::getenv(name)) return v;
  return fallback;
}
// `family` names a tiny zoo model ("llama"), or a quantized small zoo model as "<family>.<FORMAT>"
// ("llama.Q4_K_M"), or is a GGUF's absolute path.
inline std::string ZooFile(const std::string& family) {
  if (family.starts_with('/')) return family;
  if (family.find('.') != std::string::npos) return StrCat(SKIPPY_TEST_SMALL_ZOO_DIR, "/", family, ".gguf");
  return StrCat(Env("SKIPPY_ZOO_DIR", SKIPPY_TEST_ZOO_DIR), "/", family, ".gguf");
}
inline std::string ServerBin() { return Env("SKIPPY_SERVER_BIN", SKIPPY_TEST_SERVER_BIN); }

// The flags a test server starts with: `flags`, and --one-row-class=off unless they choose the
// class (--one-row-class in any form) or step lanes together whatever it costs (--lane-batching
// or --lane-batching=on, which take the class with 2+ lanes; every such test runs 2+ lanes). The class's default, auto, is a measure at each
// start, and two servers that a test compares (cache on against --no-cache, a restart against its
// disk tier) could decide it differently on a tiny model near the tolerance; a test of auto asks
// for it (--one-row-class=auto).
inline std::vector<std::string> WithPinnedClass(std::vector<std::string> flags) {
  for (const std::string& f : flags) {
    if (f.starts_with("--one-row-class") || f == "--lane-batching" || f == "--lane-batching=on") return flags;
  }
  flags.push_back("--one-row-class=off");
  return flags;
}

class ServerProcess {
 public:
  // Starts skippy-server on ZooFile(family) with WithPinnedClass(flags). Retries once on a port race.
  static std::unique_ptr<ServerProcess> Start(const std::string& family, const std::vector<std::string>& flags,
                                              const std::string& tag) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto port = FreeLoopbackPort();
      if (!port.ok()) continue;
      auto p = std::unique_ptr<ServerProcess>(new ServerProcess());
      p->port_ = *port;
      std::string name = StrCat("skippy-server-test-", tag, "-", getpid(), "-", *port, ".log");
      std::replace(name.begin(), name.end(), '/', '_');  // a tag may hold a model's path
      p->log_ = (std::filesystem::temp_directory_path() / name).string();
      std::filesystem::remove(p->log_);
      std::vector<std::string> argv = {ServerBin(), "-m", ZooFile(family), "--host", "127.0.0.1", "--port",
                                       std::to_string(*port), "-t", "1"};
      const std::vector<std::string> pinned = WithPinnedClass(flags);
      argv.insert(argv.end(), pinned.begin(), pinned.end());
      auto proc = Subprocess::Start(argv, p->log_);
      if (!proc.ok()) {
        ADD_FAILURE() << proc.status();
        return nullptr;
      }
      p->proc_ = std::make_unique<Subprocess>(std::move(*proc));
      if (p->WaitHealthy(std::chrono::seconds(60))) return p;
      if (p->proc_->Poll()) continue;  // exited (port taken?): try another port
      ADD_FAILURE() << "skippy-server did not become healthy; log:\n" << TailOfFile(p->log_);
      return nullptr;
    }
    ADD_FAILURE() << "could not start skippy-server";
    return nullptr;
  }

  ~ServerProcess() {
    if (proc_) proc_->Stop(std::chrono::milliseconds(3000));
  }

  // SIGTERM (a graceful stop: the disk tier writes what it queued), SIGKILL after `grace`; the
  // exit status.
  int Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(10000)) {
    return proc_ ? proc_->Stop(grace) : -1;
  }

  int port() const { return port_; }
  pid_t pid() const { return proc_ ? proc_->pid() : -1; }
  const std::string& log() const { return log_; }
  bool alive() { return proc_ && !proc_->Poll().has_value(); }
  std::string LogTail() const { return TailOfFile(log_, 3000); }

  std::unique_ptr<httplib::Client> Client(const std::string& api_key = "") const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_connection_timeout(2);
    c->set_read_timeout(60);
    if (!api_key.empty()) c->set_default_headers({{"Authorization", "Bearer " + api_key}});
    return c;
  }

 private:
  ServerProcess() = default;
  bool WaitHealthy(std::chrono::seconds limit) {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(1);
    const std::string listening = StrCat("listening on http://127.0.0.1:", port_, " ");
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (proc_->Poll()) return false;
      // Another test's server may hold the port this one was given (the free port was picked,
      // then closed, before this server bound it): its /health must not count. This server's own
      // log says it bound the port before it answers anything.
      if (TailOfFile(log_, 1 << 16).find(listening) == std::string::npos) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      auto r = c.Get("/health");
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  int port_ = 0;
  std::string log_;
  std::unique_ptr<Subprocess> proc_;
};

// POST a JSON body; returns (status, parsed body or null).
inline std::pair<int, nlohmann::json> PostJson(httplib::Client& c, const std::string& path, const nlohmann::json& body) {
  auto r = c.Post(path, body.dump(), "application/json");
  if (!r) return {0, nullptr};
  return {r->status, nlohmann::json::parse(r->body, nullptr, false)};
}

// A test suite that shares one server on the tiny llama model: each suite's SetUpTestSuite calls
// StartShared with its flags (Suite: the suite class, so each has a server of its own).
template <typename Suite>
class SharedServer : public ::testing::Test {
 protected:
  static void StartShared(const std::vector<std::string>& flags, const std::string& tag) {
    server_ = ServerProcess::Start("llama", flags, tag).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }
  void TearDown() override { EXPECT_TRUE(server_->alive()) << server_->LogTail(); }

  static inline ServerProcess* server_ = nullptr;
};

}  // namespace skippy::server_test
