// PrefixTier: a tier of the cache below RAM that is keyed by prefix, not by payload id, so what it
// holds outlives the process (DiskTier) or is shared between processes (SharedTier). Each entry
// carries its whole identity: the configuration identity, the tenant namespace, the payload kind,
// the token ids and the batch classes its rows were computed in (docs/DESIGN.md, "The disk tier").
//
// Serving rules are the radix index's (RadixIndex): a kResidentKv entry serves any prefix it
// shares with the request, other kinds and exact_only entries only their own length. A tier
// serves only entries of its own configuration identity and of the namespace asked for.
//
// Contract of every implementation: Lookup touches no payload; Read hands on bytes only after
// verifying them against the entry's checksum (a mismatch is DataLoss, the entry is dropped and
// counted, never served); Put never blocks on I/O (it queues, and may drop, counted); every
// method is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "skippy/cache/batch_classes.h"
#include "skippy/cache/payload_kind.h"
#include "skippy/cache/radix_index.h"
#include "skippy/common/status.h"

namespace skippy::cache {

// What an entry says about its prefix, besides its bytes.
struct PrefixRecord {
  std::string tenant_namespace;
  std::vector<Token> tokens;
  PayloadKind kind = PayloadKind::kResidentKv;
  bool exact_only = false;
  BatchClasses classes;  // of the entry's rows (classes.size() == tokens.size())
};

// A Lookup's answer: enough to decide whether to read it.
struct TierHit {
  uint64_t entry = 0;         // the tier's handle for Read
  size_t usable_tokens = 0;   // prefix length it serves for the request
  PrefixRecord record;        // of the whole entry
  uint64_t stored_bytes = 0;  // what the entry takes in the tier (header and payload)
};

class PrefixTier {
 public:
  virtual ~PrefixTier() = default;

  // "disk" or "shared": where a hit came from (responses, stats).
  virtual std::string_view Name() const = 0;
  // The longest usable prefix of `tokens` stored for `tenant_namespace`; reads no payload. Counts
  // a miss when there is none.
  virtual std::optional<TierHit> Lookup(const std::string& tenant_namespace, std::span<const Token> tokens) = 0;
  // The entry's payload, verified, into `out` (resized to it; a caller that keeps `out` between
  // reads keeps its pages). DataLoss (entry dropped, counted) when the stored bytes are not what
  // the entry's checksum says; NotFound when it was removed since the Lookup; Unavailable when
  // the store cannot be reached. On error `out` holds nothing useful.
  [[nodiscard]] virtual Status Read(const TierHit& hit, std::vector<uint8_t>& out) = 0;
  // Queues the entry for writing; false when it is dropped (counted) or already stored.
  // REQUIRES: record.tokens is not empty and lies in the vocabulary; bytes is not empty.
  virtual bool Put(PrefixRecord record, std::vector<uint8_t> bytes) = 0;
  // Waits until every queued write is done.
  virtual void Flush() = 0;
  // Removes the entries of one tenant namespace (all when nullopt), queued ones included;
  // returns how many were removed.
  virtual size_t Clear(const std::optional<std::string>& tenant_namespace) = 0;

  // The same as Read into a new vector.
  [[nodiscard]] StatusOr<std::vector<uint8_t>> Read(const TierHit& hit) {
    std::vector<uint8_t> out;
    SKIPPY_RETURN_IF_ERROR(Read(hit, out));
    return out;
  }
};

}  // namespace skippy::cache
