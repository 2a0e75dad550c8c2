#include "skippy/router/replica_view.h"

#include <algorithm>

namespace skippy::router {
namespace {

size_t CommonPrefix(std::span<const Token> a, std::span<const Token> b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first -
                             a.begin());
}

}  // namespace

ReplicaView::ReplicaView(size_t recent_prompts)
    : recent_cap_(recent_prompts), index_(std::make_unique<cache::RadixIndex>()) {}

cache::PrefixScope ReplicaView::Scope(const std::string& ns_key) const {
  // One configuration per replica: only the namespace key tells scopes apart.
  cache::PrefixScope s;
  s.config.model_id = "replica";
  s.config.n_vocab = 1;
  s.cache_namespace = ns_key;
  return s;
}

void ReplicaView::ClearLocked() {
  index_ = std::make_unique<cache::RadixIndex>();
  by_replica_id_.clear();
  lanes_.clear();
  recent_.clear();
}

void ReplicaView::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ClearLocked();
}

void ReplicaView::Apply(const nlohmann::json& e) {
  if (!e.is_object() || !e.contains("kind") || !e["kind"].is_string()) return;
  const std::string kind = e["kind"].get<std::string>();
  std::lock_guard<std::mutex> lock(mu_);
  ++events_;
  try {
    if (kind == "hello") {
      const std::string instance = e.value("instance", "");
      if (instance != instance_) ClearLocked();  // a new process: its RAM is empty
      instance_ = instance;
    } else if (kind == "reset") {
      ClearLocked();
    } else if (kind == "stored") {
      const auto tokens = e.at("tokens").get<std::vector<Token>>();
      if (tokens.empty()) return;
      cache::EntryDesc desc;
      desc.kind = cache::PayloadKind::kResidentKv;
      desc.exact_only = !e.value("shorter", false);
      auto id = index_->Insert(Scope(e.at("ns").get<std::string>()), tokens, desc);
      if (id.ok()) by_replica_id_[e.at("entry").get<uint64_t>()] = *id;
    } else if (kind == "removed") {
      auto it = by_replica_id_.find(e.at("entry").get<uint64_t>());
      if (it == by_replica_id_.end()) return;
      (void)index_->Erase(it->second, /*evicted=*/true);
      by_replica_id_.erase(it);
    } else if (kind == "cleared") {
      // The replica's removed events follow for each entry; lanes and recent prompts go now.
      const bool all = e.value("all", false);
      const std::string ns = e.value("ns", "");
      std::erase_if(lanes_, [&](const auto& kv) { return all || kv.second.ns_key == ns; });
      std::erase_if(recent_, [&](const Prompt& p) { return all || p.ns_key == ns; });
    } else if (kind == "lane") {
      lanes_[e.at("lane").get<int64_t>()] = Prompt{e.value("ns", ""), e.at("tokens").get<std::vector<Token>>()};
    }
  } catch (const nlohmann::json::exception&) {
    // A malformed event steers nothing.
  }
}

void ReplicaView::Routed(const std::string& ns_key, std::span<const Token> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  recent_.push_back(Prompt{ns_key, std::vector<Token>(tokens.begin(), tokens.end())});
  while (recent_.size() > recent_cap_) recent_.pop_front();
}

size_t ReplicaView::Match(const std::string& ns_key, std::span<const Token> tokens) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t best = 0;
  const cache::LookupResult r = index_->Peek(Scope(ns_key), tokens);
  if (r.match) best = r.match->usable_tokens;
  for (const auto& [lane, p] : lanes_) {
    if (p.ns_key == ns_key) best = std::max(best, CommonPrefix(p.tokens, tokens));
  }
  for (const Prompt& p : recent_) {
    if (p.ns_key == ns_key) best = std::max(best, CommonPrefix(p.tokens, tokens));
  }
  return best;
}

size_t ReplicaView::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_replica_id_.size();
}

uint64_t ReplicaView::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

}  // namespace skippy::router
