#include "skippy/cache/tier_writer.h"

namespace skippy::cache {

uint64_t ClearEpochs::Of(const std::string& tenant_namespace) const {
  auto it = by_namespace_.find(tenant_namespace);
  return (global_ << 32) + (it == by_namespace_.end() ? 0 : it->second);
}

void ClearEpochs::Raise(const std::optional<std::string>& tenant_namespace) {
  if (tenant_namespace) {
    ++by_namespace_[*tenant_namespace];
  } else {
    ++global_;
  }
}

void TierWriter::Start(std::function<void(Pending)> write) {
  write_ = std::move(write);
  thread_ = std::thread([this] { Loop(); });
}

bool TierWriter::Enqueue(Pending p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || queued_bytes_ + p.bytes.size() > max_queued_bytes_) return false;
    queued_bytes_ += p.bytes.size();
    queue_.push_back(std::move(p));
  }
  cv_.notify_one();
  return true;
}

void TierWriter::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

void TierWriter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t TierWriter::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_;
}

void TierWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is written
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    const uint64_t n = p.bytes.size();
    write_(std::move(p));
    lock.lock();
    queued_bytes_ -= n;
    writing_ = false;
    idle_cv_.notify_all();
  }
}

}  // namespace skippy::cache
