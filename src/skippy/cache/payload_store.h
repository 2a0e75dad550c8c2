// PayloadStore: the memory PayloadTier. Exported payload bytes (KvRecurrent states, ResidentKv
// exports, full-state diagnostics) in host RAM, stored once.
//
// A payload is split into fixed-size blocks (1 MiB by default; the last one may be shorter). Blocks
// are content-addressed: indexed by XXH3-128 of their bytes, and a matching hash is confirmed by
// comparing the bytes, so a collision stores a second block instead of aliasing. Blocks are
// reference counted across payloads; identical blocks (shared prompt prefixes, zero padding) of
// one dedup domain are stored once. SHA-256 per block is computed only at report time (BlockDigests), never on the hot
// path.
//
// Accounting: logical bytes (sum of payload sizes), physical bytes (sum of distinct block sizes),
// saved bytes (logical - physical). Physical bytes never exceed max_physical_bytes: Put evicts
// unpinned payloads in least-recently-used order (Put and Read count as use) and calls each one's
// on_evict (PayloadTier). If pinned payloads leave no room, Put fails with ResourceExhausted and
// nothing changes.
//
// Ownership: Put returns a payload id owned by the caller until Release (Erase) or eviction.
// Pinning is LevelDB-style: a pinned payload is never evicted, and a released payload that is
// still pinned stays readable until its last Unpin.
//
// Thread-safety: every method is thread-safe (one internal mutex). Put hashes and copies new
// blocks outside the critical section (taking the mutex briefly per block to probe the index) and
// publishes under it, so concurrent Puts overlap their copying. Those speculative copies mean a
// Put may briefly hold up to one payload of memory beyond the cap before it is accounted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <span>
#include <vector>

#include "skippy/common/digest.h"
#include "skippy/common/status.h"
#include "skippy/cache/payload_tier.h"

namespace skippy::cache {

struct PayloadStoreOptions {
  size_t block_size = size_t{1} << 20;
  uint64_t max_physical_bytes = uint64_t{4} << 30;
  size_t max_spare_blocks = 64;  // freed full blocks kept for reuse (avoids page faults)

  [[nodiscard]] Status Validate() const;
};

struct PayloadStats {
  size_t payloads = 0;
  size_t blocks = 0;
  uint64_t logical_bytes = 0;
  uint64_t physical_bytes = 0;
  uint64_t saved_bytes = 0;
  uint64_t puts = 0;
  uint64_t shared_block_hits = 0;
  uint64_t hash_collisions = 0;  // equal XXH3-128, different bytes
  uint64_t evictions = 0;
  size_t pinned_payloads = 0;
};

struct BlockDigest {
  uint64_t size = 0;
  Hash128Value xxh3_128;
  Sha256Digest sha256{};  // zero unless requested
};

class PayloadStore final : public PayloadTier {
 public:
  [[nodiscard]] static StatusOr<std::unique_ptr<PayloadStore>> Create(const PayloadStoreOptions& options);
  ~PayloadStore() override;

  std::string_view name() const override { return "memory"; }
  // Stores a copy of `bytes`. InvalidArgument for an empty payload or one whose distinct blocks
  // alone exceed the whole cap; ResourceExhausted when pinned payloads leave no room.
  [[nodiscard]] StatusOr<PutResult> Put(std::span<const std::byte> bytes, OnEvict on_evict,
                                        uint64_t dedup_domain) override;
  [[nodiscard]] StatusOr<PutResult> Put(std::span<const std::byte> bytes, OnEvict on_evict = nullptr) {
    return Put(bytes, std::move(on_evict), 0);
  }

  // Payload size. NotFound for an unknown or freed id.
  [[nodiscard]] StatusOr<size_t> Size(PayloadId id) const override;
  // Copies the payload into `out`. InvalidArgument unless out.size() equals the payload size.
  [[nodiscard]] Status Read(PayloadId id, std::span<std::byte> out);
  // Copies bytes [offset, offset + out.size()) of the payload into `out` (only the blocks they span).
  // OutOfRange past the payload's end.
  [[nodiscard]] Status ReadRange(PayloadId id, size_t offset, std::span<std::byte> out) override;
  [[nodiscard]] StatusOr<std::vector<std::byte>> Get(PayloadId id) override;
  // True for a payload that is stored and not released.
  bool Contains(PayloadId id) const override;
  // Release of one id.
  [[nodiscard]] Status Erase(PayloadId id) override { return Release(std::span(&id, 1)); }
  TierUsage Usage() const override;

  [[nodiscard]] Status Pin(PayloadId id);
  // FailedPrecondition if not pinned (double unpin).
  [[nodiscard]] Status Unpin(PayloadId id);

  // Releases every id in `ids`, or none: the whole batch is validated first. NotFound for an
  // unknown (or already freed) id, FailedPrecondition for an id already released but still pinned,
  // InvalidArgument for an id repeated in the batch. On error nothing changes.
  [[nodiscard]] Status Release(std::span<const PayloadId> ids);

  // Per-block digests; SHA-256 only if `with_sha256` (report time: it costs a full pass).
  [[nodiscard]] StatusOr<std::vector<BlockDigest>> BlockDigests(PayloadId id, bool with_sha256) const;

  PayloadStats Stats() const;
  // Recounts references and bytes from scratch. For tests.
  [[nodiscard]] Status CheckInvariants() const;

 private:
  struct Impl;
  explicit PayloadStore(const PayloadStoreOptions& options);
  mutable std::mutex mu_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace skippy::cache
