// A child process owned by the parent: started with an argument vector (no shell), its stdout and
// stderr appended to a log file, stopped (SIGTERM, then SIGKILL after a grace period) when Stop()
// is called or the object is destroyed. Used to run llama-server and skippy-server from tests and
// benchmarks.
//
// Thread-safety: one owner thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "skippy/common/status.h"

namespace skippy {

class Subprocess {
 public:
  // Starts argv[0] (looked up as a path, not in PATH) with argv. InvalidArgument for an empty argv
  // or a program that is not executable.
  [[nodiscard]] static StatusOr<Subprocess> Start(const std::vector<std::string>& argv, const std::string& log_path);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();

  // The exit status if the child has exited (waitpid WNOHANG), else nullopt.
  std::optional<int> Poll();
  // Polls until the child exits or `limit` passes: its exit status, or nullopt when it still runs.
  std::optional<int> Wait(std::chrono::milliseconds limit);
  // Stops the child: SIGTERM, wait up to `grace`, then SIGKILL. Returns its exit status
  // (128 + signal when killed by a signal). Idempotent.
  int Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(3000));
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

 private:
  Subprocess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  std::string log_path_;
};

// A TCP port on 127.0.0.1 that was free when asked (bind to port 0). Racy by nature; callers retry.
StatusOr<int> FreeLoopbackPort();

// The last `max_bytes` of a text file (for error messages that quote a server log).
std::string TailOfFile(const std::string& path, size_t max_bytes = 2000);

}  // namespace skippy
