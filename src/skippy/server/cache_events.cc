#include "skippy/server/cache_events.h"

#include "skippy/cache/entry_codec.h"
#include "skippy/common/digest.h"

namespace skippy::server {

std::string NamespaceKey(const std::string& ns) {
  return cache::HexOf(Hash128(std::as_bytes(std::span(ns.data(), ns.size()))));
}

void CacheEventLog::Append(lane_cache::CacheEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back(next_++, std::move(event));
    while (events_.size() > capacity_) events_.pop_front();
  }
  cv_.notify_all();
}

CacheEventLog::Batch CacheEventLog::WaitAfter(uint64_t after, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return closed_ || next_ - 1 > after; });
  Batch b;
  b.closed = closed_;
  b.last = after;
  if (!events_.empty() && events_.front().first > after + 1) b.reset = true;
  for (const auto& [seq, e] : events_) {
    if (seq <= after) continue;
    b.lines.push_back(ToJson(seq, e).dump());
    b.last = seq;
  }
  return b;
}

void CacheEventLog::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

uint64_t CacheEventLog::last() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ - 1;
}

nlohmann::json CacheEventLog::ToJson(uint64_t seq, const lane_cache::CacheEvent& e) {
  using Kind = lane_cache::CacheEvent::Kind;
  nlohmann::json j = {{"seq", seq}, {"kind", lane_cache::CacheEventKindName(e.kind)}};
  switch (e.kind) {
    case Kind::kStored:
      j["entry"] = e.entry;
      j["ns"] = NamespaceKey(e.tenant_namespace);
      j["tokens"] = e.tokens;
      j["shorter"] = e.serves_shorter;
      break;
    case Kind::kRemoved: j["entry"] = e.entry; break;
    case Kind::kCleared:
      if (e.all) {
        j["all"] = true;
      } else {
        j["ns"] = NamespaceKey(e.tenant_namespace);
      }
      break;
    case Kind::kLane:
      j["lane"] = e.lane;
      j["ns"] = NamespaceKey(e.tenant_namespace);
      j["tokens"] = e.tokens;
      break;
  }
  return j;
}

}  // namespace skippy::server
