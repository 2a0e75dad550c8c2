#include "skippy/common/worker_pool.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace skippy {

struct WorkerPool::State {
  size_t base = 1, most = 1, most_waiting = 0;
  std::chrono::milliseconds idle_timeout{0};
  std::mutex mu;
  std::condition_variable work;    // a task or shutdown
  std::condition_variable exited;  // a thread ended
  std::deque<std::function<void()>> tasks;
  size_t running = 0;   // threads alive
  size_t idle = 0;      // threads waiting for a task
  size_t starting = 0;  // threads started that have not yet waited once: about to be idle
  bool shutdown = false;

  void Start(const std::shared_ptr<State>& self, bool extra) {  // under mu
    ++running;
    ++starting;
    std::thread(&WorkerPool::Work, self, extra).detach();
  }
};

WorkerPool::WorkerPool(size_t base, size_t most, size_t most_waiting, std::chrono::milliseconds idle_timeout)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.base = std::max<size_t>(1, base);
  s.most = std::max(most, s.base);
  s.most_waiting = most_waiting;
  s.idle_timeout = idle_timeout;
  std::lock_guard lock(s.mu);
  for (size_t i = 0; i < s.base; ++i) s.Start(state_, false);
}

WorkerPool::~WorkerPool() { Shutdown(); }

bool WorkerPool::Submit(std::function<void()> task) {
  State& s = *state_;
  {
    std::lock_guard lock(s.mu);
    if (s.shutdown) return false;
    // A task that no idle (or starting) thread will take gets a new thread while there is room;
    // only beyond that does it wait, and only up to most_waiting.
    const bool uncovered = s.tasks.size() + 1 > s.idle + s.starting;
    if (uncovered && s.running < s.most) {
      s.Start(state_, true);
    } else if (uncovered && s.tasks.size() >= s.most_waiting) {
      return false;
    }
    s.tasks.push_back(std::move(task));
  }
  s.work.notify_one();
  return true;
}

void WorkerPool::Work(std::shared_ptr<State> sp, bool extra) {
  State& s = *sp;
  std::unique_lock lock(s.mu);
  --s.starting;
  while (true) {
    ++s.idle;
    const auto ready = [&] { return s.shutdown || !s.tasks.empty(); };
    const bool got = extra ? s.work.wait_for(lock, s.idle_timeout, ready) : (s.work.wait(lock, ready), true);
    --s.idle;
    if (!got || s.tasks.empty()) break;  // idle too long (an extra), or shut down with nothing left
    std::function<void()> task = std::move(s.tasks.front());
    s.tasks.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what it holds is released outside the lock
    lock.lock();
  }
  --s.running;
  s.exited.notify_all();
}

void WorkerPool::Shutdown() {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  s.shutdown = true;
  s.work.notify_all();
  s.exited.wait(lock, [&] { return s.running == 0; });
}

size_t WorkerPool::threads() const {
  std::lock_guard lock(state_->mu);
  return state_->running;
}

size_t WorkerPool::waiting() const {
  std::lock_guard lock(state_->mu);
  return state_->tasks.size();
}

}  // namespace skippy
