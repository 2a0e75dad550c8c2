// SharedTier: prefix entries in a Redis (or Valkey) server that several replicas of one model
// share, so a prefix one replica computed is a read for the others, and a replica that restarts
// finds what the fleet computed (docs/DESIGN.md, "The shared tier").
//
// Keys, with P the key prefix, I the hex XXH3-128 of the configuration identity's canonical
// encoding and N the hex XXH3-128 of a tenant namespace:
//   P:I:set          SET of the entry keys of identity I
//   P:I:m:KEY        an entry's manifest: its head (entry_codec.h, with blocks): the identity, the
//                    PrefixRecord (namespace, kind, tokens, batch classes), the payload's size and
//                    its blocks' sizes and XXH3-128s. KEY is EntryKey, hex.
//   P:b:N:HASH       a payload block (block_bytes, the last one shorter), content-addressed
//                    within its namespace: replicas that record the same prefix store it once,
//                    and no tenant's entry can name another tenant's blocks
//   P:I:ev           pub/sub channel: "S KEY" stored, "R KEY" removed, "C N" or "C *" cleared
//
// Each replica keeps a mirror of identity I's manifests (a RadixIndex, no payloads): built from
// P:I:set once subscribed to the channel (Open waits for that) and after each reconnect, and kept
// current by the channel's events. Lookup therefore
// never touches the network. Read fetches the manifest and every block in one pipelined round
// trip, checks that the manifest is still the one looked up and verifies each block's XXH3-128;
// a missing or corrupt block, or a manifest that names another identity, is a miss that removes
// the entry from Redis (and is counted), never bytes handed on.
//
// Capacity is Redis's: run it with maxmemory and an allkeys-lru policy. An evicted block or
// manifest is a miss (counted as gone) and the entry is dropped.
//
// Failure: every command has a deadline (timeout_ms). A replica that cannot reach Redis, or whose
// command times out, drops the connection and makes no new attempt for retry_ms; meanwhile Read
// answers Unavailable at once and Put drops (counted), so requests recompute, never fail or wait.
// Open succeeds while Redis is down (the tier connects later); it fails only for bad options or a
// password that Redis refuses.
//
// Writes are asynchronous: Put queues a copy (TierWriter) and its thread stores the blocks Redis does
// not have yet (EXISTS first, so a prefix recorded by several replicas crosses the network once),
// then the manifest, the set member and the event.
//
// Thread-safety: every method is thread-safe. Lookup takes only the mirror's lock; Read, the
// writer and the event thread each use their own connection.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "skippy/cache/entry_codec.h"
#include "skippy/cache/prefix_identity.h"
#include "skippy/cache/prefix_tier.h"
#include "skippy/cache/radix_index.h"
#include "skippy/cache/tier_writer.h"
#include "skippy/common/status.h"

namespace skippy::cache {

struct SharedTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password;             // AUTH; "" for none
  std::string key_prefix = "skippy";
  uint32_t timeout_ms = 250;        // connect and each round trip; past it the operation is a miss
  uint32_t retry_ms = 1000;         // after a failure, no new connection attempt for this long
  uint64_t block_bytes = uint64_t{1} << 20;
  uint64_t max_queued_bytes = uint64_t{256} << 20;  // payload bytes waiting for the writer

  [[nodiscard]] Status Validate() const;
  std::string Endpoint() const;  // "host:port"
};

struct SharedTierStats {
  std::string endpoint;
  bool connected = false;        // subscribed to the replicas' events, mirror current
  size_t entries = 0;            // this identity's manifests in the mirror
  size_t loaded_at_open = 0;
  uint64_t hits = 0;             // Reads that verified
  uint64_t misses_never_seen = 0;
  uint64_t misses_evicted = 0;
  uint64_t misses_gone = 0;      // manifest or a block no longer in Redis (its LRU, a clear)
  uint64_t corrupt = 0;          // entries removed because a check failed
  uint64_t foreign = 0;          // manifests under this identity's keys naming another identity
  uint64_t unavailable = 0;      // Reads answered Unavailable (Redis down, slow or refusing)
  uint64_t writes = 0;           // entries stored
  uint64_t write_skips = 0;      // already stored, or cleared while queued
  uint64_t write_drops = 0;      // queue full, or Redis unreachable
  uint64_t write_errors = 0;     // Redis refused a command (out of memory ...)
  uint64_t blocks_written = 0;
  uint64_t blocks_deduplicated = 0;  // already in Redis: not sent
  uint64_t events = 0;           // events received from the channel
  uint64_t resyncs = 0;          // mirror rebuilt from the set (Open, every reconnect)
  uint64_t queued_bytes = 0;
  double read_ms = 0;            // total time in verified Reads
  double write_ms = 0;
};

class RedisLink;

class SharedTier final : public PrefixTier {
 public:
  // InvalidArgument for bad options or identity; PermissionDenied when Redis refuses the password.
  // A Redis that cannot be reached is not an error (see above).
  [[nodiscard]] static StatusOr<std::unique_ptr<SharedTier>> Open(const SharedTierOptions& options,
                                                                  const CacheConfigIdentity& identity);
  // Writes what is queued (each write bounded by the deadline), then disconnects.
  ~SharedTier() override;
  SharedTier(const SharedTier&) = delete;
  SharedTier& operator=(const SharedTier&) = delete;

  std::string_view Name() const override { return "shared"; }
  std::optional<TierHit> Lookup(const std::string& tenant_namespace, std::span<const Token> tokens) override;
  using PrefixTier::Read;
  [[nodiscard]] Status Read(const TierHit& hit, std::vector<uint8_t>& out) override;
  bool Put(PrefixRecord record, std::vector<uint8_t> bytes) override;
  void Flush() override;
  // Removes the namespace's entries of this identity from Redis (manifests and their blocks) and
  // tells the other replicas; what the mirror holds is removed even when Redis is unreachable.
  size_t Clear(const std::optional<std::string>& tenant_namespace) override;

  // Waits (at most `timeout_ms`) until the mirror holds `n` entries or more: tests, and a
  // benchmark that must not race the event channel.
  bool WaitForEntries(size_t n, uint32_t timeout_ms);
  SharedTierStats Stats() const;

 private:
  struct Known {
    std::string key;       // EntryKey, hex
    Hash128Value manifest_hash;
    EntryHead head;        // blocks included
    uint64_t stored_bytes = 0;
  };

  SharedTier(const SharedTierOptions& options, const CacheConfigIdentity& identity);
  std::string ManifestKey(const std::string& key) const;
  std::string BlockKey(const std::string& tenant_namespace, const Hash128Value& h) const;
  PrefixScope ScopeOf(const std::string& tenant_namespace) const;

  // Parses a manifest fetched for `key` and adds it to the mirror (no-op when known).
  void Learn(const std::string& key, std::string_view manifest);
  void ForgetLocked(EntryId id);                                   // REQUIRES: mu_ held
  void Forget(const std::string& key);
  // Rebuilds the mirror from P:I:set (uses the read link).
  Status Resync();
  // Removes an entry that failed a check from Redis and tells the replicas.
  void Drop(const Known& k);
  void EventLoop();
  void OnEvent(std::string_view message);
  void Write(TierWriter::Pending p);  // on the writer's thread

  const SharedTierOptions options_;
  const CacheConfigIdentity identity_;
  const std::string identity_encoding_;
  const std::string identity_hex_;
  const std::string set_key_;   // P:I:set
  const std::string channel_;   // P:I:ev

  std::unique_ptr<RedisLink> read_link_;   // Read, Resync, Clear, event follow-ups
  std::mutex read_mu_;
  std::unique_ptr<RedisLink> write_link_;  // the writer thread only

  mutable std::mutex mu_;
  std::condition_variable entries_cv_;     // the mirror grew
  RadixIndex index_;
  std::map<EntryId, Known> known_;
  std::map<std::string, EntryId> by_key_;
  ClearEpochs epochs_;
  SharedTierStats stats_;
  bool stop_ = false;  // the event thread ends

  TierWriter writer_;  // stopped first (in ~SharedTier), while what Write uses still exists

  bool first_sync_done_ = false;          // the subscriber's first attempt is over (Open waits for it)
  std::atomic<bool> connected_{false};     // subscribed, and the mirror rebuilt since

  std::mutex event_mu_;
  int event_fd_ = -1;                      // the subscriber's socket, shut down to stop it
  std::condition_variable event_cv_;       // wakes the event thread's retry sleep
  std::thread events_;
};

// Values the replicas of one fleet agree on. The first replica to propose a value for a name sets
// it; every later proposal, and every Get, gets that first value back. For choices a replica makes
// by measuring at startup that enter the entries' identity (the one-row class): replicas that
// chose differently would share no entries. Key: P:agree:<hex XXH3-128 of the name>, no expiry (an
// agreement Redis evicts under its LRU is proposed anew by the next replica that starts).
//
// Each call is one round trip under the options' deadline: Unavailable when Redis cannot be
// reached in time (the caller then decides alone), PermissionDenied when it refuses the password.
//
// Thread-safety: none; one instance per thread (startup code).
class SharedAgreement {
 public:
  explicit SharedAgreement(const SharedTierOptions& options);
  ~SharedAgreement();
  SharedAgreement(const SharedAgreement&) = delete;
  SharedAgreement& operator=(const SharedAgreement&) = delete;

  // The value agreed for `name`; nullopt when none is yet.
  [[nodiscard]] StatusOr<std::optional<std::string>> Get(std::string_view name);
  // Sets `proposal` unless a value is agreed already; returns the value agreed (SET NX, then GET,
  // in one pipeline: a race between two proposals has one winner, and both learn it).
  [[nodiscard]] StatusOr<std::string> Propose(std::string_view name, std::string_view proposal);

 private:
  std::string KeyOf(std::string_view name) const;

  const SharedTierOptions options_;
  std::unique_ptr<RedisLink> link_;
};

}  // namespace skippy::cache
