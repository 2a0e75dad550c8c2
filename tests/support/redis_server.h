// A redis-server child process on a free loopback port with a password, for tests of the shared
// tier: no persistence, stopped on destruction; Kill and Restart (same port, empty) for fault
// tests; a few direct commands to inspect and damage what the tier stored.
#pragma once

#include <hiredis/hiredis.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "skippy/common/strings.h"
#include "skippy/common/subprocess.h"

namespace skippy::testing {

class RedisServer {
 public:
  static constexpr const char* kPassword = "skippy-test-password";

  // nullptr (and a test failure) when redis-server cannot be started.
  static std::unique_ptr<RedisServer> Start(const std::string& maxmemory = "") {
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto port = FreeLoopbackPort();
      if (!port.ok()) continue;
      std::unique_ptr<RedisServer> r(new RedisServer(*port, maxmemory));
      if (r->Launch()) return r;
    }
    ADD_FAILURE() << "could not start redis-server (is the redis-server package installed?)";
    return nullptr;
  }
  ~RedisServer() { Kill(); }

  int port() const { return port_; }
  // SIGKILL: the tier sees connections refused.
  void Kill() {
    if (proc_) {
      ::kill(proc_->pid(), SIGKILL);
      proc_->Stop(std::chrono::milliseconds(1000));
      proc_.reset();
    }
  }
  // SIGSTOP / SIGCONT: the tier sees a Redis that accepts and never answers.
  void Pause() { ::kill(proc_->pid(), SIGSTOP); }
  void Resume() { ::kill(proc_->pid(), SIGCONT); }
  // A new, empty server on the same port.
  bool Restart() {
    Kill();
    return Launch();
  }

  // One command, its reply as text ("" for nil); nullopt when the server cannot be reached.
  std::optional<std::string> Command(const std::vector<std::string>& args) const {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, timeval{2, 0});
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return std::nullopt;
    }
    std::optional<std::string> out;
    if (auto* a = static_cast<redisReply*>(redisCommand(c, "AUTH %s", kPassword))) freeReplyObject(a);
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()))) {
      out = Text(r);
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }
  // Keys matching `pattern`.
  std::vector<std::string> Keys(const std::string& pattern) const {
    std::vector<std::string> out;
    auto text = Command({"KEYS", pattern});
    if (!text) return out;
    for (size_t at = 0; at < text->size();) {
      const size_t nl = text->find('\n', at);
      out.push_back(text->substr(at, nl - at));
      at = nl == std::string::npos ? text->size() : nl + 1;
    }
    return out;
  }

 private:
  RedisServer(int port, std::string maxmemory) : port_(port), maxmemory_(std::move(maxmemory)) {}

  // Arrays become their elements' text, one per line.
  static std::string Text(const redisReply* r) {
    switch (r->type) {
      case REDIS_REPLY_STRING:
      case REDIS_REPLY_STATUS:
      case REDIS_REPLY_ERROR: return std::string(r->str, r->len);
      case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
      case REDIS_REPLY_ARRAY: {
        std::string s;
        for (size_t i = 0; i < r->elements; ++i) s += (i ? "\n" : "") + Text(r->element[i]);
        return s;
      }
      default: return "";
    }
  }

  static std::string Binary() {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    for (size_t at = 0; at <= dirs.size();) {
      const size_t colon = std::min(dirs.find(':', at), dirs.size());
      const auto candidate = std::filesystem::path(dirs.substr(at, colon - at)) / "redis-server";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
      at = colon + 1;
    }
    return "/usr/bin/redis-server";
  }

  bool Launch() {
    const std::string log = (std::filesystem::temp_directory_path() /
                             StrCat("skippy-redis-test-", ::getpid(), "-", port_, ".log"))
                                .string();
    std::vector<std::string> argv = {Binary(), "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                     "--requirepass", kPassword, "--save", "", "--appendonly", "no",
                                     "--daemonize", "no"};
    if (!maxmemory_.empty()) {
      argv.insert(argv.end(), {"--maxmemory", maxmemory_, "--maxmemory-policy", "allkeys-lru"});
    }
    auto proc = Subprocess::Start(argv, log);
    if (!proc.ok()) return false;
    proc_ = std::make_unique<Subprocess>(std::move(*proc));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (proc_->Poll()) break;
      if (Command({"PING"}) == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    proc_->Stop(std::chrono::milliseconds(500));
    proc_.reset();
    return false;
  }

  int port_;
  std::string maxmemory_;
  std::unique_ptr<Subprocess> proc_;
};

}  // namespace skippy::testing
