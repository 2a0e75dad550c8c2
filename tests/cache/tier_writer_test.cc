// TierWriter and ClearEpochs: entries are written in order on the writer's thread, the queued-byte
// cap refuses what would pass it, Flush waits for the queue, Stop writes what is queued; a Clear
// raises its namespace's epoch (or every namespace's) and nothing else.
#include "skippy/cache/tier_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace skippy::cache {
namespace {

TierWriter::Pending Entry(int id, size_t bytes, uint64_t epoch = 0) {
  TierWriter::Pending p;
  p.record.tokens = {id};
  p.bytes.assign(bytes, static_cast<uint8_t>(id));
  p.epoch = epoch;
  return p;
}

TEST(TierWriter, WritesInOrderOffTheCallersThreadAndFlushWaits) {
  std::mutex mu;
  std::vector<int> written;
  std::atomic<bool> other_thread{true};
  const auto caller = std::this_thread::get_id();
  TierWriter w(1 << 20);
  w.Start([&](TierWriter::Pending p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (std::this_thread::get_id() == caller) other_thread = false;
    std::lock_guard l(mu);
    written.push_back(p.record.tokens[0]);
  });
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(w.Enqueue(Entry(i, 100)));
  w.Flush();
  EXPECT_EQ(w.queued_bytes(), 0u);
  std::lock_guard l(mu);
  EXPECT_EQ(written, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_TRUE(other_thread.load());
}

TEST(TierWriter, TheQueuedByteCapRefusesAndStopWritesWhatIsQueued) {
  std::atomic<bool> release{false};
  std::atomic<int> written{0};
  {
    TierWriter w(1000);
    w.Start([&](TierWriter::Pending) {
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++written;
    });
    EXPECT_TRUE(w.Enqueue(Entry(1, 600)));   // taken by the writer, still counted while written
    EXPECT_TRUE(w.Enqueue(Entry(2, 400)));   // exactly at the cap
    EXPECT_FALSE(w.Enqueue(Entry(3, 1)));    // past it
    EXPECT_EQ(w.queued_bytes(), 1000u);
    release = true;
    w.Stop();
    EXPECT_FALSE(w.Enqueue(Entry(4, 1)));  // stopped
  }
  EXPECT_EQ(written, 2);
}

TEST(ClearEpochs, AClearMovesItsNamespaceOnlyAndAGlobalClearMovesAll) {
  ClearEpochs e;
  const uint64_t a = e.Of("a"), b = e.Of("b");
  e.Raise(std::string("a"));
  EXPECT_NE(e.Of("a"), a);
  EXPECT_EQ(e.Of("b"), b);
  const uint64_t a2 = e.Of("a");
  e.Raise(std::nullopt);
  EXPECT_NE(e.Of("a"), a2);
  EXPECT_NE(e.Of("b"), b);
  EXPECT_NE(e.Of("never-seen"), 0u);
}

}  // namespace
}  // namespace skippy::cache
