// skippy-router: an OpenAI-compatible front over N skippy-server replicas of one model. Each
// request goes to the replica that holds the longest prefix of it (learned from the replicas'
// /cache/events), balanced against load; --policy round-robin makes it a plain balancer (the
// baseline for a llama-server fleet).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "skippy/router/router.h"

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  skippy::router::RouterOptions o;
  CLI::App app{"skippy-router: routes requests over skippy-server replicas by cached prefix"};
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "port to listen on")->capture_default_str()->check(CLI::Range(1, 65535));
  app.add_option("--replica", o.replicas, "a replica's HOST:PORT (repeat for each)")->required();
  std::string policy = "cache-aware";
  app.add_option("--policy", policy, "cache-aware (by cached prefix, balanced against load) or round-robin")
      ->capture_default_str()->check(CLI::IsMember({"cache-aware", "round-robin"}));
  app.add_option("--cache-threshold", o.policy_options.cache_threshold,
                 "route by prefix only when a replica holds at least this fraction of the prompt")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--balance-abs", o.policy_options.balance_abs,
                 "loads are out of balance above this many requests per lane between busiest and idlest")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_option("--balance-rel", o.policy_options.balance_rel, "... and above this ratio")
      ->capture_default_str()->check(CLI::Range(1.0, 1e6));
  app.add_option("--replica-key", o.replica_key, "API key (without a namespace) for the replicas' /cache/events");
  app.add_option("--read-timeout-secs", o.read_timeout_seconds,
                 "how long a replica may take to answer a request that is not streamed (then 504)")
      ->capture_default_str()->check(CLI::Range(1, 86400));
  app.add_option("--retries", o.retries, "times a request is sent to another replica after one fails")
      ->capture_default_str()->check(CLI::Range(0, 16));
  int drain_seconds = 30;
  app.add_option("--drain-seconds", drain_seconds, "on SIGTERM, seconds requests in flight get before exit")
      ->capture_default_str()->check(CLI::Range(0, 3600));
  app.add_option("--http-threads", o.http_threads, "HTTP worker threads always running")
      ->capture_default_str()->check(CLI::Range(4, 4096));
  app.add_option("--max-connections", o.max_connections,
                 "connections served at once (workers grow up to this; a quarter more wait; then closed at accept)")
      ->capture_default_str()->check(CLI::Range(8, 65536));
  CLI11_PARSE(app, argc, argv);
  o.policy = policy == "round-robin" ? skippy::router::Policy::kRoundRobin : skippy::router::Policy::kCacheAware;
  for (const std::string& r : o.replicas) {
    const size_t colon = r.rfind(':');
    // At most five digits before the number is read, so no port string can overflow it.
    if (colon == std::string::npos || colon == 0 || r.find_first_not_of("0123456789", colon + 1) != std::string::npos ||
        colon + 1 == r.size() || r.size() - colon - 1 > 5 || std::stoi(r.substr(colon + 1)) < 1 ||
        std::stoi(r.substr(colon + 1)) > 65535) {
      std::fprintf(stderr, "skippy-router: --replica must be HOST:PORT, got '%s'\n", r.c_str());
      return 2;
    }
  }
  std::signal(SIGPIPE, SIG_IGN);
  skippy::router::Router router(o);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::atomic<bool> done{false};
  // SIGTERM: new requests get 503, those in flight get --drain-seconds to finish, then exit.
  std::thread watcher([&] {
    while (!g_stop && !done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done) return;
    router.BeginDrain();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(drain_seconds);
    while (router.in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    router.Stop();
  });
  const auto s = router.Run();
  done = true;
  watcher.join();
  if (!s.ok()) {
    std::fprintf(stderr, "skippy-router: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
