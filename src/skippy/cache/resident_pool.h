// ResidentPool: the bounded set of cached prefixes kept for reuse, and the sequence ids they live in.
//
// The pool owns a RadixIndex and enforces three caps -- entries, bytes and resident tokens (tokens of
// entries that hold a cache sequence, i.e. KV cells kept in the live context) -- counting live
// entries, erased-but-pinned entries (their payload is still held) and open reservations. It hands
// out cache sequence ids from a configured range [seq_id_begin, seq_id_end) that must not overlap
// the lane range [0, lane_count): lanes decode requests, cache sequences hold prefixes that lanes
// copy from.
//
// Recording is two-phase: Reserve() claims capacity (evicting if needed) and a sequence id, the
// caller prefills/captures into it, then Commit() makes the entry findable or Abort() gives the
// capacity back. The pool never touches llama.cpp: every entry it evicts or frees is RETURNED, and
// the caller must free that entry's sequence (llama_memory_seq_rm) or payload before reusing the
// sequence id handed out with the same call.
//
// Eviction picks unpinned entries in the index's order (LRU, or cost-aware: least recompute cost
// saved per byte first). Pinned entries are never evicted. If the caps cannot be met by evicting
// unpinned entries, Reserve fails with ResourceExhausted and nothing changes.
//
// Thread-safety: none; externally synchronized (Cache holds a mutex around every call).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "skippy/cache/radix_index.h"

namespace skippy::cache {

struct ResidentPoolOptions {
  size_t max_entries = 64;
  uint64_t max_bytes = uint64_t{8} << 30;
  // Caps the tokens of entries that hold a cache sequence (KV cells kept in the live context);
  // entries whose payload lives elsewhere (payload store) count against entries and bytes only.
  size_t max_tokens = size_t{1} << 20;
  int32_t lane_count = 1;    // lanes own sequence ids [0, lane_count)
  int32_t seq_id_begin = 1;  // cache sequences [seq_id_begin, seq_id_end); must not overlap lanes
  int32_t seq_id_end = 65;
  RadixIndexOptions index;

  // InvalidArgument if a cap is zero or the sequence range is reversed or overlaps the lanes. An
  // empty range is a pool without resident entries (every payload lives in the payload store).
  [[nodiscard]] Status Validate() const;
};

// What to record.
struct RecordRequest {
  PayloadKind kind = PayloadKind::kResidentKv;
  uint64_t bytes = 0;            // charge (KV bytes/token * tokens, or the exported state size)
  double recompute_cost = 0;     // e.g. estimated prefill ms for the prefix
  bool needs_sequence = true;    // false when the payload lives outside the context (payload store)
  bool exact_only = false;       // see EntryDesc::exact_only (sliding-window resident entries)
};

using ReservationId = uint64_t;

struct Reservation {
  ReservationId id = 0;
  int32_t seq_id = kNoSequence;      // where to build the prefix; kNoSequence if !needs_sequence
  std::vector<EntryInfo> evictions;  // entries evicted to make room: free them BEFORE using seq_id
};

struct PoolStats {
  RadixStats index;
  size_t reserved_entries = 0;
  size_t reserved_tokens = 0;
  uint64_t reserved_bytes = 0;
  size_t used_entries = 0;   // live + zombie + reserved: what the caps are checked against
  size_t used_tokens = 0;
  size_t resident_tokens = 0;  // tokens of entries holding a cache sequence: what max_tokens caps
  uint64_t used_bytes = 0;
  size_t free_sequences = 0;
  uint64_t reserve_failures = 0;
};

class ResidentPool {
 public:
  // InvalidArgument if the options do not validate.
  [[nodiscard]] static StatusOr<std::unique_ptr<ResidentPool>> Create(const ResidentPoolOptions& options);

  // Claims capacity for an entry of `tokens` in `scope`.
  //   InvalidArgument     bad scope, empty prompt, token outside the vocabulary, or an entry larger
  //                       than a whole cap (bytes > max_bytes or tokens > max_tokens)
  //   FailedPrecondition  an entry of this kind already exists (or is being recorded) there, or a
  //                       sequence is asked of a pool without any
  //   ResourceExhausted   pinned entries and open reservations leave no room; nothing changed
  [[nodiscard]] StatusOr<Reservation> Reserve(const PrefixScope& scope, std::span<const Token> tokens,
                                              const RecordRequest& request);
  // Makes a reserved entry findable. payload_id: where the payload went (0 = none). NotFound for an
  // unknown reservation.
  [[nodiscard]] StatusOr<EntryId> Commit(ReservationId id, uint64_t payload_id = 0);
  // Gives a reservation's capacity and sequence id back. NotFound for an unknown reservation.
  [[nodiscard]] Status Abort(ReservationId id);

  // See RadixIndex::Lookup / Peek. With pin, the caller must Release(match->entry.id).
  LookupResult Lookup(const PrefixScope& scope, std::span<const Token> tokens, bool pin);
  LookupResult Peek(const PrefixScope& scope, std::span<const Token> tokens) const;

  [[nodiscard]] Status Pin(EntryId id);
  // Drops one pin. Returns the entry if it was erased and this was its last pin: the caller frees
  // its sequence/payload now. FailedPrecondition on a double release (nothing changes).
  [[nodiscard]] StatusOr<std::optional<EntryInfo>> Release(EntryId id);
  // Removes an entry (not counted as an eviction). Returns it if freed now (not pinned).
  [[nodiscard]] StatusOr<std::optional<EntryInfo>> Erase(EntryId id);

  PoolStats Stats() const;
  const RadixIndex& index() const { return index_; }
  const ResidentPoolOptions& options() const { return options_; }
  // Index invariants plus pool accounting. For tests.
  [[nodiscard]] Status CheckInvariants() const;

 private:
  struct Pending {
    PrefixScope scope;
    std::vector<Token> tokens;
    RecordRequest request;
    int32_t seq_id = kNoSequence;
  };

  explicit ResidentPool(const ResidentPoolOptions& options);
  void FreeResources(const EntryInfo& info);
  bool SequenceOwned(int32_t seq) const {
    return seq >= options_.seq_id_begin && seq < options_.seq_id_end;
  }

  ResidentPoolOptions options_;
  RadixIndex index_;
  std::set<int32_t> free_seqs_;
  absl::flat_hash_map<ReservationId, Pending> pending_;
  ReservationId next_reservation_ = 1;
  size_t held_entries_ = 0;  // live + zombie entries
  size_t held_tokens_ = 0;
  uint64_t held_bytes_ = 0;
  size_t held_resident_tokens_ = 0;  // of held entries with a cache sequence
  size_t reserved_entries_ = 0;
  size_t reserved_resident_tokens_ = 0;
  size_t reserved_tokens_ = 0;
  uint64_t reserved_bytes_ = 0;
  uint64_t reserve_failures_ = 0;
};

}  // namespace skippy::cache
