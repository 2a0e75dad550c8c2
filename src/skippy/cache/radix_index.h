// RadixIndex: which stored prefix can serve a request.
//
// One token-granular compressed radix tree per PrefixScope (configuration + tenant namespace).
// Entries sit at token boundaries and describe a payload held elsewhere (a resident cache sequence,
// a payload-store id); the index never owns payload bytes, it only charges them.
//
// Serving rules (docs/DESIGN.md, "Payloads and prefix identity"):
//   - A kResidentKv entry of length n serves any prefix length L <= n that the request shares with
//     it: a stored descendant serves an ancestor position (attention KV can be truncated).
//   - Every other kind serves only the exact boundary where it was recorded.
// Lookup returns the longest usable prefix. Ties: an entry recorded exactly at that length wins
// (lowest PayloadKind value first); otherwise the kResidentKv entry whose tokens sort first
// lexicographically (a prefix sorts before its extensions). This makes answers deterministic.
//
// Pinning (LevelDB-style handles): Lookup(..., pin=true) and Pin() raise an entry's reference
// count; a pinned entry is never offered for eviction. Erase() removes an entry from the tree at
// once (no new lookup finds it), but a pinned entry stays alive -- its payload must stay valid --
// until the last Unpin(), which returns it as freed so the caller can release the payload.
//
// Eviction order is kept here (the pool decides caps): unpinned live entries ordered by
// (priority, last use, id), where priority is 0 under LRU and recompute_cost / bytes under the
// cost-aware policy (the entry that saves the least recompute per byte held goes first).
//
// Miss reasons: a miss is kEvicted when an entry that would have served it was removed from the
// same scope (remembered as a bounded "ghost" tree), else kIdentityMismatch when another scope of
// the same namespace (another configuration: model, KV types, kernels ...) holds an entry that
// would serve the same tokens, else kNeverSeen. Other namespaces are never consulted, so a miss
// reason tells a tenant nothing about what other tenants have cached.
//
// Thread-safety: none. A RadixIndex must be externally synchronized (Cache does this).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "skippy/cache/payload_kind.h"
#include "skippy/cache/prefix_identity.h"
#include "skippy/common/status.h"

namespace skippy::cache {

using EntryId = uint64_t;  // never 0
inline constexpr int32_t kNoSequence = -1;

enum class EvictionPolicy : uint8_t { kLru, kCostAware };

// What the caller records about an entry.
struct EntryDesc {
  PayloadKind kind = PayloadKind::kResidentKv;
  uint64_t bytes = 0;            // charge against byte caps
  int32_t seq_id = kNoSequence;  // resident cache sequence holding the payload, if any
  uint64_t payload_id = 0;       // payload-store id holding the payload, if any (0 = none)
  double recompute_cost = 0;     // cost to recompute the prefix (any unit, used relatively)
  // A kResidentKv entry that serves only its exact boundary: a sliding-window (SWA) KV cache keeps
  // only the window of its last tokens, so it cannot serve a shorter prefix. Other kinds are
  // exact-boundary entries anyway.
  bool exact_only = false;
};

// True when an entry can serve prefixes shorter than its own length (attention KV that is not
// sliding-window).
constexpr bool ServesShorterPrefixes(const EntryDesc& d) { return d.kind == PayloadKind::kResidentKv && !d.exact_only; }

struct EntryInfo {
  EntryId id = 0;
  size_t tokens = 0;  // recorded prefix length
  EntryDesc desc;
};

struct Match {
  EntryInfo entry;
  size_t usable_tokens = 0;     // prefix length this entry serves for the request (> 0)
  bool exact_boundary = false;  // usable_tokens == entry.tokens
};

enum class MissReason : uint8_t { kNeverSeen, kEvicted, kIdentityMismatch };
std::string_view MissReasonName(MissReason reason);  // "never-seen", "evicted", "identity-mismatch"

struct LookupResult {
  std::optional<Match> match;                   // nullopt on a miss
  MissReason miss_reason = MissReason::kNeverSeen;  // meaningful only on a miss
  // How many of the request's first tokens follow the token path of some live entry of its scope
  // (hit or miss; >= match->usable_tokens on a hit): where the request branches off the prompts
  // the cache has seen, which is where the next request on that path will likely branch too.
  size_t path_tokens = 0;
  bool hit() const { return match.has_value(); }
};

struct RadixStats {
  size_t scopes = 0;
  size_t nodes = 0;          // tree nodes, roots excluded
  size_t edge_tokens = 0;    // token ids stored on edges (memory proxy)
  size_t entries = 0;        // live entries (findable)
  size_t tokens = 0;         // sum of live entries' recorded lengths
  uint64_t bytes = 0;        // sum of live entries' byte charges
  size_t pinned_entries = 0; // live or erased entries with a reference count > 0
  size_t zombie_entries = 0; // erased but still pinned
  size_t zombie_tokens = 0;
  uint64_t zombie_bytes = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t miss_never_seen = 0;
  uint64_t miss_evicted = 0;
  uint64_t miss_identity_mismatch = 0;
  uint64_t evictions = 0;    // entries removed by Erase(..., /*evicted=*/true)
  size_t ghosts = 0;
};

struct RadixIndexOptions {
  EvictionPolicy policy = EvictionPolicy::kLru;
  size_t max_ghost_entries = 4096;    // removed entries remembered for miss reasons
  size_t max_ghost_tokens = 1 << 20;  // and their total tokens
};

class RadixIndex {
 public:
  explicit RadixIndex(RadixIndexOptions options = {});
  ~RadixIndex();
  RadixIndex(const RadixIndex&) = delete;
  RadixIndex& operator=(const RadixIndex&) = delete;

  // Records an entry at the exact boundary `tokens` (length >= 1) in `scope`. The entry starts
  // unpinned and most recently used.
  // REQUIRES: tokens were validated (ValidateTokens) by the caller.
  // FailedPrecondition if the scope already has an entry of the same kind at this boundary.
  [[nodiscard]] StatusOr<EntryId> Insert(const PrefixScope& scope, std::span<const Token> tokens,
                                         const EntryDesc& desc);

  // The longest usable prefix of `tokens` in `scope`. Counts a hit or a miss (with its reason),
  // marks the serving entry most recently used, and if `pin` adds a reference the caller must
  // drop with Unpin(match->entry.id).
  LookupResult Lookup(const PrefixScope& scope, std::span<const Token> tokens, bool pin);

  // The same answer as Lookup, without touching recency, pins or statistics (miss reason
  // included).
  LookupResult Peek(const PrefixScope& scope, std::span<const Token> tokens) const;

  // The live entry of `kind` recorded exactly at `tokens` in `scope`, if any. No side effects.
  std::optional<EntryId> FindExact(const PrefixScope& scope, std::span<const Token> tokens,
                                   PayloadKind kind) const;

  // Adds a reference. NotFound if the id is unknown or already freed (an erased but still pinned
  // entry can be pinned again).
  [[nodiscard]] Status Pin(EntryId id);
  // Drops a reference. FailedPrecondition if the entry is not pinned (double release); NotFound if
  // unknown. Returns the entry when this was the last reference of an erased entry: it is now
  // freed and the caller releases its payload.
  [[nodiscard]] StatusOr<std::optional<EntryInfo>> Unpin(EntryId id);

  // Removes a live entry from its tree (nodes merge back). Returns the entry if it is freed now;
  // nullopt if it is pinned (freed by the last Unpin). `evicted` counts it as an eviction.
  // NotFound if the id is unknown or already erased.
  [[nodiscard]] StatusOr<std::optional<EntryInfo>> Erase(EntryId id, bool evicted);

  // Live or zombie entry by id; nullptr when unknown. The pointer is valid until the next
  // non-const call.
  const EntryInfo* Find(EntryId id) const;
  bool IsPinned(EntryId id) const;
  bool IsLive(EntryId id) const;  // findable by lookups (not erased)
  // The recorded tokens of a live or zombie entry (empty if unknown).
  std::vector<Token> TokensOf(EntryId id) const;

  // Visits unpinned live entries in eviction order until `visit` returns false.
  void ForEachEvictable(const std::function<bool(const EntryInfo&)>& visit) const;

  RadixStats Stats() const;
  // Checks every structural invariant (subtree counts, merged nodes, accounting). For tests.
  [[nodiscard]] Status CheckInvariants() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace skippy::cache
