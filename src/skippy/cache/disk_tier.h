// DiskTier: prefix entries in a directory, so a cached prefix outlives the process that computed
// it. The memory tier (PayloadTier) holds payloads by process-local id; a tier that survives a
// restart must also hold what identifies each payload, so the disk tier is keyed by prefix: the
// configuration identity, the tenant namespace, the payload kind and the token ids, with the
// batch classes the rows were computed in (docs/DESIGN.md, "The disk tier").
//
// Layout of DIR:
//   LOCK                 flock'ed by the one process that owns DIR (it holds that process's pid)
//   entries/<key>.skc    one file per entry: a header (identity, namespace, kind, tokens, classes,
//                        payload size and XXH3-128), the header's XXH3-64, then the payload
//   tmp/                 files being written; a file is renamed into entries/ only once written
//                        and fsync'ed, so entries/ never holds a torn write
//
// Open reads every entry's header (not its payload) and rebuilds the index. An entry whose
// identity differs from this configuration (another model, llama.cpp commit, patch series, KV
// layout, context setting ...) is ignored and counted as foreign, never served; it stays on disk
// (another configuration may use the directory next) and counts against the cap. A file whose
// header does not verify, or whose size is not what its header says, is removed and counted as
// corrupt, and so is every leftover of tmp/.
//
// Read verifies the payload's checksum and that the file still holds the entry looked up; a
// mismatch is a miss that removes the entry and counts it (DataLoss), never bytes handed on.
//
// Writes are asynchronous: Put queues a copy of the bytes (TierWriter) and its thread writes them
// (temporary file, fsync, rename, fsync of the directory), evicting least-recently-used entries
// to stay under the byte cap and skipping a write that would leave less than min_free_bytes free
// on the filesystem. A full queue drops the write (counted); the entry stays in RAM only.
//
// Serving rules are the radix index's (RadixIndex): a kResidentKv entry serves any prefix it
// shares with the request, other kinds and exact_only entries only their own length.
//
// Thread-safety: every method is thread-safe. Lookups and Read do their file work outside the
// internal lock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "skippy/cache/batch_classes.h"
#include "skippy/cache/payload_kind.h"
#include "skippy/cache/prefix_identity.h"
#include "skippy/cache/prefix_tier.h"
#include "skippy/cache/radix_index.h"
#include "skippy/cache/tier_writer.h"
#include "skippy/common/status.h"

namespace skippy::cache {

struct DiskTierOptions {
  std::string dir;
  uint64_t max_bytes = uint64_t{8} << 30;          // cap on the files of entries/ (all identities)
  uint64_t min_free_bytes = uint64_t{256} << 20;   // a write never leaves the filesystem with less
  uint64_t max_queued_bytes = uint64_t{256} << 20; // payload bytes waiting for the writer

  [[nodiscard]] Status Validate() const;
};

struct DiskTierStats {
  std::string dir;
  size_t entries = 0;            // this identity's, servable
  uint64_t bytes = 0;            // files of entries/ (this identity's and foreign ones)
  uint64_t capacity_bytes = 0;
  size_t foreign_entries = 0;    // another identity's: kept, never served
  uint64_t foreign_bytes = 0;
  size_t loaded_at_open = 0;     // entries of this identity found by Open
  uint64_t hits = 0;             // Reads that verified
  uint64_t misses_never_seen = 0;
  uint64_t misses_evicted = 0;
  uint64_t misses_gone = 0;      // removed between Lookup and Read
  uint64_t corrupt = 0;          // entries removed because a check failed (Open or Read)
  uint64_t read_errors = 0;      // I/O errors on read
  uint64_t writes = 0;           // entries written
  uint64_t write_skips = 0;      // already on disk, or cleared while queued
  uint64_t write_drops = 0;      // queue full, larger than the cap
  uint64_t write_errors = 0;     // I/O errors (the entry stays in RAM only)
  uint64_t no_space = 0;         // writes skipped for min_free_bytes
  uint64_t evictions = 0;        // entries removed for the cap
  uint64_t queued_bytes = 0;
  double read_ms = 0;            // total time in verified Reads
  double write_ms = 0;           // total time writing entries
};

// The flock on DIR/LOCK that makes one process DIR's owner. A server takes it before it reads or
// writes anything under DIR (the disk tier, the one-row class decision kept beside it), so a
// second server on the same directory is refused before it has touched any of it.
class CacheDirLock {
 public:
  // Creates DIR if needed and locks it, writing this process's pid into LOCK. FailedPrecondition
  // when another process (or another CacheDirLock of this one) holds it; the OS error's code when
  // DIR cannot be created or LOCK written.
  [[nodiscard]] static StatusOr<std::shared_ptr<const CacheDirLock>> Acquire(const std::string& dir);
  ~CacheDirLock();  // releases the flock
  CacheDirLock(const CacheDirLock&) = delete;
  CacheDirLock& operator=(const CacheDirLock&) = delete;

  const std::string& dir() const { return dir_; }

 private:
  CacheDirLock(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  const std::string dir_;
  const int fd_;
};

class DiskTier final : public PrefixTier {
 public:
  // Creates DIR (and its subdirectories) if needed, takes its lock (or keeps `lock`, which must be
  // DIR's) and rebuilds the index. InvalidArgument for bad options or identity, or a lock of
  // another directory; FailedPrecondition when another process holds DIR; PermissionDenied (or
  // the OS error's code) when DIR cannot be created or written.
  [[nodiscard]] static StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options,
                                                                const CacheConfigIdentity& identity,
                                                                std::shared_ptr<const CacheDirLock> lock = nullptr);
  // Writes what is queued, then drops its reference to the lock (released with the last one).
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // PrefixTier. Lookup marks the entry used (LRU); Read checks that the file still holds the
  // entry looked up and verifies its payload.
  std::string_view Name() const override { return "disk"; }
  std::optional<TierHit> Lookup(const std::string& tenant_namespace, std::span<const Token> tokens) override;
  using PrefixTier::Read;
  [[nodiscard]] Status Read(const TierHit& hit, std::vector<uint8_t>& out) override;
  bool Put(PrefixRecord record, std::vector<uint8_t> bytes) override;
  void Flush() override;
  size_t Clear(const std::optional<std::string>& tenant_namespace) override;

  DiskTierStats Stats() const;

 private:
  struct Stored {
    std::string file;  // under entries/
    std::string tenant_namespace;
    uint64_t file_bytes = 0;
    bool exact_only = false;
    BatchClasses classes;
  };
  struct Foreign {
    std::string file;
    uint64_t file_bytes = 0;
  };

  DiskTier(const DiskTierOptions& options, const CacheConfigIdentity& identity,
           std::shared_ptr<const CacheDirLock> lock);
  Status Load();
  PrefixScope ScopeOf(const std::string& tenant_namespace) const;
  void Write(TierWriter::Pending p);  // on the writer's thread
  // Evicts until `incoming` more bytes fit; false when they cannot. REQUIRES: mu_ held.
  bool MakeRoom(uint64_t incoming);
  void RemoveLocked(EntryId id, bool evicted);  // REQUIRES: mu_ held

  const DiskTierOptions options_;
  const CacheConfigIdentity identity_;
  const std::string identity_encoding_;
  const std::shared_ptr<const CacheDirLock> lock_;

  mutable std::mutex mu_;
  RadixIndex index_;
  std::map<EntryId, Stored> stored_;
  std::deque<Foreign> foreign_;  // oldest first: evicted before this identity's entries
  uint64_t bytes_ = 0;
  ClearEpochs epochs_;
  DiskTierStats stats_;

  TierWriter writer_;  // last: stopped first (in ~DiskTier), while what Write uses still exists
};

}  // namespace skippy::cache
