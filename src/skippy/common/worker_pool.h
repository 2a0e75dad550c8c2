// WorkerPool: runs connection tasks on threads that grow with demand. `base` threads always run;
// whenever more tasks wait than threads are idle, one more thread starts, up to `most`; a thread
// above `base` idle for `idle_timeout` exits. At most `most_waiting` tasks wait for a thread:
// Submit refuses the next one (the caller closes that connection).
//
// Why not a fixed pool: an HTTP connection holds its worker while the client is slow or idle, so
// a few slow clients would take every worker and stop /health. Why not cpp-httplib's own growing
// pool: it starts a thread only when no thread is idle at the moment of a submit, so a burst of
// connections leaves tasks queued behind busy workers (a health check waited 10-60 s behind 32
// slow clients).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

namespace skippy {

class WorkerPool {
 public:
  WorkerPool(size_t base, size_t most, size_t most_waiting,
             std::chrono::milliseconds idle_timeout = std::chrono::seconds(3));
  ~WorkerPool();  // Shutdown()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False when `most_waiting` tasks already wait, or after Shutdown: the task is not run.
  bool Submit(std::function<void()> task);
  // Runs the tasks already submitted, then waits for every thread to exit. Idempotent.
  void Shutdown();

  size_t threads() const;  // running now
  size_t waiting() const;  // tasks not started

 private:
  struct State;  // shared with the threads, which are detached and may outlive a Shutdown's return
  static void Work(std::shared_ptr<State> s, bool extra);
  std::shared_ptr<State> state_;
};

}  // namespace skippy
