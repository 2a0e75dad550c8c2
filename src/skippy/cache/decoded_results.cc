#include "skippy/cache/decoded_results.h"

#include <algorithm>
#include <string>

namespace skippy::cache {

DecodedResultCache::DecodedResultCache(DecodedResultOptions options) : options_(options) {
  stats_.capacity_entries = options.max_entries;
  stats_.capacity_bytes = options.max_bytes;
}

uint64_t DecodedResultCache::KeyOf(const PrefixScope& scope, std::span<const Token> tokens) {
  return HashTokens(tokens, scope.Fingerprint());
}

DecodedResultCache::List::iterator DecodedResultCache::FindItem(const PrefixScope& scope,
                                                                std::span<const Token> tokens,
                                                                uint64_t key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return lru_.end();
  for (List::iterator item : it->second) {
    if (item->tokens.size() == tokens.size() &&
        std::equal(tokens.begin(), tokens.end(), item->tokens.begin()) && item->scope == scope) {
      return item;
    }
  }
  return lru_.end();
}

void DecodedResultCache::Remove(List::iterator item) {
  auto it = by_key_.find(item->key);
  auto& vec = it->second;
  vec.erase(std::find(vec.begin(), vec.end(), item));
  if (vec.empty()) by_key_.erase(it);
  stats_.bytes -= item->bytes;
  --stats_.entries;
  lru_.erase(item);
}

Status DecodedResultCache::Put(const PrefixScope& scope, std::span<const Token> tokens,
                               std::vector<float> logits) {
  SKIPPY_RETURN_IF_ERROR(scope.Validate());
  SKIPPY_RETURN_IF_ERROR(ValidateTokens(scope.config, tokens));
  if (logits.size() != static_cast<size_t>(scope.config.n_vocab)) {
    return absl::InvalidArgumentError("decoded result has " + std::to_string(logits.size()) +
                                      " logits, expected n_vocab = " + std::to_string(scope.config.n_vocab));
  }
  uint64_t bytes = logits.size() * sizeof(float) + tokens.size() * sizeof(Token);
  if (bytes > options_.max_bytes || options_.max_entries == 0) {
    return absl::InvalidArgumentError("decoded result of " + std::to_string(bytes) +
                                      " bytes is larger than the whole cap of " +
                                      std::to_string(options_.max_bytes) + " bytes");
  }
  uint64_t key = KeyOf(scope, tokens);
  if (auto old = FindItem(scope, tokens, key); old != lru_.end()) Remove(old);
  while (!lru_.empty() && (stats_.entries + 1 > options_.max_entries || stats_.bytes + bytes > options_.max_bytes)) {
    Remove(std::prev(lru_.end()));
    ++stats_.evictions;
  }
  Item item;
  item.scope = scope;
  item.tokens.assign(tokens.begin(), tokens.end());
  item.key = key;
  item.bytes = bytes;
  item.result = std::make_shared<const DecodedResult>(DecodedResult{std::move(logits)});
  lru_.push_front(std::move(item));
  by_key_[key].push_back(lru_.begin());
  stats_.bytes += bytes;
  ++stats_.entries;
  return absl::OkStatus();
}

std::shared_ptr<const DecodedResult> DecodedResultCache::Get(const PrefixScope& scope,
                                                             std::span<const Token> tokens) {
  auto item = FindItem(scope, tokens, KeyOf(scope, tokens));
  if (item == lru_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, item);  // iterators stay valid
  return item->result;
}

bool DecodedResultCache::Erase(const PrefixScope& scope, std::span<const Token> tokens) {
  auto item = FindItem(scope, tokens, KeyOf(scope, tokens));
  if (item == lru_.end()) return false;
  Remove(item);
  return true;
}

}  // namespace skippy::cache
