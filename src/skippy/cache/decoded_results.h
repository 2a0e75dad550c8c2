// DecodedResultCache: for an exact repeat of a whole prompt, what sampling needs -- the logits of
// the last prompt position -- so a hit answers without decoding at all.
//
// Keyed by the full prefix identity (PrefixScope) plus every token of the prompt; the key hash
// (scope fingerprint + XXH3-64 of tokens) only indexes, a hit is confirmed by comparing the scope
// and the tokens. Bounded by entries and bytes (logits + tokens); least recently used first out.
//
// Ownership: Get returns a shared_ptr to an immutable result; it stays valid after eviction.
// Thread-safety: none; externally synchronized (Cache holds a mutex around every call).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "skippy/cache/prefix_identity.h"

namespace skippy::cache {

struct DecodedResult {
  std::vector<float> logits;  // last-position logits, n_vocab values
};

struct DecodedResultOptions {
  size_t max_entries = 1024;
  uint64_t max_bytes = uint64_t{256} << 20;
};

struct DecodedResultStats {
  size_t entries = 0;
  uint64_t bytes = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  size_t capacity_entries = 0;  // the caps, from DecodedResultOptions
  uint64_t capacity_bytes = 0;
};

class DecodedResultCache {
 public:
  explicit DecodedResultCache(DecodedResultOptions options = {});

  // Stores (or replaces) the result for exactly `tokens` in `scope`.
  //   InvalidArgument  bad tokens (see ValidateTokens), logits.size() != n_vocab, or an entry
  //                    larger than the whole byte cap. Nothing changes on error.
  [[nodiscard]] Status Put(const PrefixScope& scope, std::span<const Token> tokens,
                           std::vector<float> logits);
  // The result for exactly these tokens, or nullptr. Counts a hit or miss and refreshes recency.
  std::shared_ptr<const DecodedResult> Get(const PrefixScope& scope, std::span<const Token> tokens);
  bool Erase(const PrefixScope& scope, std::span<const Token> tokens);

  DecodedResultStats Stats() const { return stats_; }

 private:
  struct Item {
    PrefixScope scope;
    std::vector<Token> tokens;
    uint64_t key = 0;
    uint64_t bytes = 0;
    std::shared_ptr<const DecodedResult> result;
  };
  using List = std::list<Item>;  // front = most recent

  static uint64_t KeyOf(const PrefixScope& scope, std::span<const Token> tokens);
  List::iterator FindItem(const PrefixScope& scope, std::span<const Token> tokens, uint64_t key);
  void Remove(List::iterator it);

  DecodedResultOptions options_;
  List lru_;
  absl::flat_hash_map<uint64_t, std::vector<List::iterator>> by_key_;
  DecodedResultStats stats_;
};

}  // namespace skippy::cache
