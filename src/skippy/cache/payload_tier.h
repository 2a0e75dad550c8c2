// PayloadTier: where exported payload bytes live once they leave the llama.cpp context. The seam
// for more than one tier: the in-memory PayloadStore is one, a disk or a shared tier another, and
// the code that records and restores entries sees only this interface.
//
// Ownership: Put hands the caller a payload id it owns until it calls Erase, or until the tier
// evicts the payload to stay under its cap. Evictions reach the owner through the callback it
// passed to Put (LevelDB's cache deleters are the model), never through lists handed back: the
// tier calls `on_evict(id)` once per evicted payload, after its own lock is released, on the
// thread whose call caused the eviction. The callback may call the tier again; an id it receives
// is already gone (Contains is false, Erase is NotFound). Erase by the owner never calls it.
//
// Accounting: logical bytes (sum of payload sizes) and physical bytes (what the tier holds after
// deduplication, what the cap bounds). Get and ReadRange count as use for the eviction order.
//
// Dedup domains: a tier may store equal bytes once, but only within one domain (the lane cache
// passes one per tenant namespace). Whether a Put stored new bytes, and so how physical bytes
// move, must never tell one tenant what another has stored.
//
// Thread-safety: every method of every tier is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "skippy/common/status.h"

namespace skippy::cache {

using PayloadId = uint64_t;  // never 0

struct PutResult {
  PayloadId id = 0;
  size_t new_blocks = 0;     // blocks stored by this call
  size_t shared_blocks = 0;  // blocks found already stored (or repeated within the payload)
};

struct TierUsage {
  size_t payloads = 0;
  uint64_t logical_bytes = 0;
  uint64_t physical_bytes = 0;
  uint64_t capacity_bytes = 0;  // the physical cap
  uint64_t evictions = 0;       // payloads evicted for the cap, ever
};

class PayloadTier {
 public:
  using OnEvict = std::function<void(PayloadId)>;

  virtual ~PayloadTier() = default;

  // "memory", "disk", ...: for stats and logs.
  virtual std::string_view name() const = 0;

  // Stores a copy of `bytes`, evicting least-recently-used payloads (each owner told through its
  // own on_evict) if the cap needs room; bytes are shared only with payloads of the same
  // dedup_domain. InvalidArgument for an empty payload or one larger than the whole cap;
  // ResourceExhausted when nothing may be evicted. On error nothing changes.
  [[nodiscard]] virtual StatusOr<PutResult> Put(std::span<const std::byte> bytes, OnEvict on_evict,
                                                uint64_t dedup_domain) = 0;
  // NotFound for an unknown, erased or evicted id.
  [[nodiscard]] virtual StatusOr<size_t> Size(PayloadId id) const = 0;
  [[nodiscard]] virtual StatusOr<std::vector<std::byte>> Get(PayloadId id) = 0;
  // Bytes [offset, offset + out.size()); OutOfRange past the payload's end.
  [[nodiscard]] virtual Status ReadRange(PayloadId id, size_t offset, std::span<std::byte> out) = 0;
  virtual bool Contains(PayloadId id) const = 0;
  // Gives the payload back; NotFound for an unknown or already erased id.
  [[nodiscard]] virtual Status Erase(PayloadId id) = 0;
  virtual TierUsage Usage() const = 0;
};

}  // namespace skippy::cache
