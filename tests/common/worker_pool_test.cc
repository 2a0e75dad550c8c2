// WorkerPool: a burst of blocking tasks gets a thread each up to the cap (none waits behind busy
// threads while there is room), the cap holds, waiting tasks are bounded and the rest refused,
// extra threads retire when idle, and Shutdown runs what was accepted.
#include "skippy/common/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace {

using namespace std::chrono_literals;

// Tasks that block until opened.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void Wait() {
    std::unique_lock l(mu);
    cv.wait(l, [&] { return open; });
  }
  void Open() {
    std::lock_guard l(mu);
    open = true;
    cv.notify_all();
  }
};

template <typename F>
bool Eventually(F f, std::chrono::milliseconds within = 2000ms) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return f();
}

TEST(WorkerPool, ABurstOfBlockingTasksEachGetsAThreadThenALateTaskRunsAtOnce) {
  skippy::WorkerPool pool(4, 64, 8, 200ms);
  Gate gate;
  std::atomic<int> started{0};
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(pool.Submit([&] {
      ++started;
      gate.Wait();
    }));
  }
  EXPECT_TRUE(Eventually([&] { return started == 32; })) << started;
  EXPECT_EQ(pool.waiting(), 0u);
  // A quick task submitted now runs beside the 32 blocked ones.
  std::atomic<bool> quick{false};
  ASSERT_TRUE(pool.Submit([&] { quick = true; }));
  EXPECT_TRUE(Eventually([&] { return quick.load(); }, 500ms));
  gate.Open();
  // The extra threads retire once idle; the base ones stay.
  EXPECT_TRUE(Eventually([&] { return pool.threads() == 4; }));
}

TEST(WorkerPool, TheCapHoldsAndWaitingTasksAreBoundedThenRefused) {
  skippy::WorkerPool pool(2, 6, 3, 200ms);
  Gate gate;
  std::atomic<int> started{0}, ran{0};
  auto blocked = [&] {
    ++started;
    gate.Wait();
    ++ran;
  };
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pool.Submit(blocked));
  EXPECT_TRUE(Eventually([&] { return started == 6; }));
  EXPECT_EQ(pool.threads(), 6u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.Submit(blocked)) << i;  // they wait
  EXPECT_FALSE(pool.Submit(blocked));                                   // no thread, no room to wait
  EXPECT_EQ(pool.threads(), 6u);
  EXPECT_EQ(pool.waiting(), 3u);
  gate.Open();
  EXPECT_TRUE(Eventually([&] { return ran == 9; }));
}

TEST(WorkerPool, ShutdownRunsWhatWasAcceptedAndRefusesMore) {
  std::atomic<int> ran{0};
  skippy::WorkerPool pool(1, 1, 100);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(pool.Submit([&] {
      std::this_thread::sleep_for(1ms);
      ++ran;
    }));
  }
  pool.Shutdown();
  EXPECT_EQ(ran, 20);
  EXPECT_EQ(pool.threads(), 0u);
  EXPECT_FALSE(pool.Submit([] {}));
  pool.Shutdown();  // again: nothing to do
}

}  // namespace
