// Cache: the thread-safe facade the runtime adapter and the server call from every lane.
//
// It composes a ResidentPool (radix index + caps + sequence ids + eviction) and a
// DecodedResultCache behind one mutex, and validates input before anything changes.
//
// Concurrency contract:
//   - Every method may be called from any thread at any time. Each call takes one internal mutex
//     for its whole duration; the work done under it is index bookkeeping, O(prompt length) for a
//     lookup or reservation, never llama.cpp work and never payload copies.
//   - Nothing returned points into the cache: results are copies (EntryInfo, Reservation) or
//     shared_ptr to immutable data (DecodedResult).
//   - What keeps llama.cpp state valid between calls is pinning: a hit from Lookup is pinned, so
//     its sequence id / payload id stays valid (it is not evicted, and an Erase is deferred) until
//     the caller's Release. Typical lane flow:
//         r = Lookup(scope, prompt)            // pinned on a hit
//         copy r.match->usable_tokens tokens of KV from r.match->entry.desc.seq_id into the lane
//         Release(r.match->entry.id)           // free the returned entry's sequence if non-null
//         res = Reserve(scope, prompt, req)    // free every res.evictions[i] sequence first,
//         prefill into the lane, copy into res.seq_id,  Commit(res.id)  (or Abort(res.id))
//   - Entries returned as evicted or freed are no longer tracked by the cache; the caller must
//     free their llama.cpp sequence (and release their payload-store id) before it reuses the
//     sequence id it got from the same or a later Reserve.
//   - PayloadStore is separate and has its own lock; Cache never calls it, so there is no lock
//     ordering between them.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "skippy/cache/decoded_results.h"
#include "skippy/cache/resident_pool.h"

namespace skippy::cache {

struct CacheOptions {
  ResidentPoolOptions pool;
  DecodedResultOptions decoded;
};

struct CacheStats {
  PoolStats pool;
  DecodedResultStats decoded;
};

class Cache {
 public:
  // InvalidArgument for bad options.
  [[nodiscard]] static StatusOr<std::unique_ptr<Cache>> Create(const CacheOptions& options);

  // Longest usable prefix, pinned on a hit (Release it). InvalidArgument for a bad scope, an empty
  // prompt or a token outside [0, n_vocab); counters unchanged then.
  [[nodiscard]] StatusOr<LookupResult> Lookup(const PrefixScope& scope, std::span<const Token> tokens);
  // Same answer, no pin, no recency, no statistics.
  [[nodiscard]] StatusOr<LookupResult> Peek(const PrefixScope& scope, std::span<const Token> tokens) const;
  // Drops a pin taken by Lookup or Pin; returns the entry if it is now freed (see ResidentPool).
  [[nodiscard]] StatusOr<std::optional<EntryInfo>> Release(EntryId id);
  [[nodiscard]] Status Pin(EntryId id);

  // Two-phase record; see ResidentPool.
  [[nodiscard]] StatusOr<Reservation> Reserve(const PrefixScope& scope, std::span<const Token> tokens,
                                              const RecordRequest& request);
  [[nodiscard]] StatusOr<EntryId> Commit(ReservationId id, uint64_t payload_id = 0);
  [[nodiscard]] Status Abort(ReservationId id);
  [[nodiscard]] StatusOr<std::optional<EntryInfo>> Erase(EntryId id);

  // Decoded-result entries (exact repeat of a whole prompt). See DecodedResultCache.
  [[nodiscard]] Status PutDecoded(const PrefixScope& scope, std::span<const Token> tokens,
                                  std::vector<float> last_logits);
  // nullptr on a miss; InvalidArgument for bad input.
  [[nodiscard]] StatusOr<std::shared_ptr<const DecodedResult>> GetDecoded(const PrefixScope& scope,
                                                                          std::span<const Token> tokens);

  CacheStats Stats() const;
  [[nodiscard]] Status CheckInvariants() const;

 private:
  Cache(std::unique_ptr<ResidentPool> pool, const DecodedResultOptions& decoded);

  mutable std::mutex mu_;
  std::unique_ptr<ResidentPool> pool_;
  DecodedResultCache decoded_;
};

}  // namespace skippy::cache
