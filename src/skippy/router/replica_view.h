// ReplicaView: what skippy-router knows of one replica's prefix cache, learned from the events the
// replica publishes (GET /cache/events: entries stored and removed, namespaces cleared, what each
// lane keeps of its last prompt) and from the requests the router itself just sent there (a
// prompt being prefilled is about to be in a lane). Match() says how many leading tokens of a
// prompt the replica would likely restore.
//
// The view is advisory: it steers routing and is never a reason to serve anything, so a view that
// lags (a reconnect, a reset) only costs a worse choice. Entries use the radix index's serving
// rules (an entry that serves shorter prefixes matches any shared prefix; others only whole).
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/cache/radix_index.h"

namespace skippy::router {

using Token = cache::Token;

class ReplicaView {
 public:
  explicit ReplicaView(size_t recent_prompts = 8);

  // Applies one event's JSON (CacheEventLog::ToJson; "hello" and "reset" clear the view when the
  // instance changed or events were lost). Unknown kinds are ignored.
  void Apply(const nlohmann::json& event);
  // A prompt the router just sent to this replica (it will be in a lane soon).
  void Routed(const std::string& ns_key, std::span<const Token> tokens);
  // Forgets everything (the replica restarted, or the event stream broke).
  void Clear();

  // Leading tokens of `tokens` the replica likely holds for namespace key `ns_key`.
  size_t Match(const std::string& ns_key, std::span<const Token> tokens) const;

  size_t entries() const;
  uint64_t events() const;
  const std::string& instance() const { return instance_; }

 private:
  struct Prompt {
    std::string ns_key;
    std::vector<Token> tokens;
  };
  cache::PrefixScope Scope(const std::string& ns_key) const;
  void ClearLocked();

  const size_t recent_cap_;
  mutable std::mutex mu_;
  std::unique_ptr<cache::RadixIndex> index_;
  std::map<uint64_t, cache::EntryId> by_replica_id_;
  std::map<int64_t, Prompt> lanes_;
  std::deque<Prompt> recent_;
  std::string instance_;
  uint64_t events_ = 0;
};

}  // namespace skippy::router
