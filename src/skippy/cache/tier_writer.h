// TierWriter: the write-behind queue of a tier below RAM (DiskTier, SharedTier). Put queues a
// record and its payload, bounded in queued bytes; one thread hands the entries, in order, to the
// tier's write function, so a lane never waits on a file or a network write.
//
// ClearEpochs: what makes a Clear win over writes in flight. Each queued entry carries its
// namespace's epoch from Put; Clear raises it; the write function makes an entry reachable only
// if the epoch has not moved, checked under the tier's lock.
//
// Thread-safety: TierWriter is thread-safe (its own lock, never held while `write` runs, so the
// tier may call Enqueue under its lock). ClearEpochs has no lock: the tier's guards it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "skippy/cache/prefix_tier.h"

namespace skippy::cache {

class ClearEpochs {
 public:
  uint64_t Of(const std::string& tenant_namespace) const;
  // A namespace's Clear, or every namespace's (nullopt).
  void Raise(const std::optional<std::string>& tenant_namespace);

 private:
  std::map<std::string, uint64_t> by_namespace_;
  uint64_t global_ = 0;
};

class TierWriter {
 public:
  struct Pending {
    PrefixRecord record;
    std::vector<uint8_t> bytes;
    uint64_t epoch = 0;  // ClearEpochs::Of the record's namespace at Put
  };

  explicit TierWriter(uint64_t max_queued_bytes) : max_queued_bytes_(max_queued_bytes) {}
  ~TierWriter() { Stop(); }
  TierWriter(const TierWriter&) = delete;
  TierWriter& operator=(const TierWriter&) = delete;

  // Starts the thread that hands each queued entry to `write`. Once.
  void Start(std::function<void(Pending)> write);
  // Queues the entry; false (not queued) when its bytes would pass the cap.
  bool Enqueue(Pending p);
  // Returns once every entry queued before the call is written (or given up).
  void Flush();
  // Writes what is queued, then ends the thread. The tier calls it first in its destructor, while
  // what `write` uses still exists. Idempotent.
  void Stop();
  uint64_t queued_bytes() const;

 private:
  void Loop();

  const uint64_t max_queued_bytes_;
  std::function<void(Pending)> write_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // the queue changed, or stop
  std::condition_variable idle_cv_;  // an entry was written
  std::deque<Pending> queue_;
  uint64_t queued_bytes_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace skippy::cache
