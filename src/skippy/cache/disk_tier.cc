#include "skippy/cache/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "skippy/cache/entry_codec.h"
#include "skippy/common/digest.h"
#include "skippy/common/strings.h"

namespace skippy::cache {
namespace {

namespace fs = std::filesystem;

// File: an entry head (entry_codec.h) and then the payload.
constexpr EntryFormat kFormat{"SKPYDSK1", 1, /*with_blocks=*/false};
constexpr std::string_view kSuffix = ".skc";

Status ErrnoStatus(int err, const std::string& what) {
  const std::string msg = StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS: return absl::PermissionDeniedError(msg);
    case ENOENT: return absl::NotFoundError(msg);
    case ENOSPC:
    case EDQUOT: return absl::ResourceExhaustedError(msg);
    default: return absl::InternalError(msg);
  }
}

// Reads exactly out.size() bytes at `offset`; false on a short read or an error (errno set).
bool PreadAll(int fd, char* out, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    out += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open " + dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : ErrnoStatus(err, "fsync " + dir);
}

// Reads the header of an open entry file of `size` bytes.
StatusOr<EntryHead> ReadHeader(int fd, uint64_t size) {
  std::string prefix(kEntryPrefixBytes, '\0');
  if (size < kEntryPrefixBytes + kEntryHashBytes || !PreadAll(fd, prefix.data(), prefix.size(), 0)) {
    return absl::DataLossError("truncated entry");
  }
  SKIPPY_ASSIGN_OR_RETURN(const uint32_t header_len, ParseEntryPrefix(kFormat, prefix));
  const uint64_t head_len = kEntryPrefixBytes + uint64_t{header_len} + kEntryHashBytes;
  if (head_len > size) return absl::DataLossError("truncated entry");
  std::string head(head_len, '\0');
  if (!PreadAll(fd, head.data(), head.size(), 0)) return absl::DataLossError("truncated entry");
  SKIPPY_ASSIGN_OR_RETURN(EntryHead h, ParseEntryHead(kFormat, head));
  if (head_len + h.payload_len != size) {
    return absl::DataLossError(StrCat("entry is ", size, " bytes, its header says ", head_len + h.payload_len));
  }
  return h;
}

// Reads out.size() bytes at `offset` into `out` in pieces and their XXH3-128 into `hash`; false on
// a short read or an error (errno set). A large payload is hashed on a second thread as its pieces
// arrive, each while it is still in cache: the copy from the kernel and the hash overlap.
bool ReadHashed(int fd, uint64_t offset, std::vector<uint8_t>& out, Hash128Value& hash) {
  constexpr size_t kPiece = size_t{256} << 10;
  constexpr size_t kParallelFrom = size_t{4} << 20;
  Hash128Stream stream;
  auto piece = [&](size_t off) { return std::min(kPiece, out.size() - off); };
  auto read = [&](size_t off) { return PreadAll(fd, reinterpret_cast<char*>(out.data() + off), piece(off), offset + off); };
  if (out.size() < kParallelFrom) {
    for (size_t off = 0; off < out.size(); off += kPiece) {
      if (!read(off)) return false;
      stream.Update(std::as_bytes(std::span(out.data() + off, piece(off))));
    }
    hash = stream.Digest();
    return true;
  }
  constexpr size_t kFailed = ~size_t{0};
  std::atomic<size_t> ready{0};  // bytes read so far, or kFailed
  std::thread hasher([&] {
    for (size_t off = 0; off < out.size();) {
      size_t upto;
      // Blocks (a futex), so a read from the device does not cost the other core a spin.
      while ((upto = ready.load(std::memory_order_acquire)) <= off) ready.wait(upto, std::memory_order_acquire);
      if (upto == kFailed) return;
      stream.Update(std::as_bytes(std::span(out.data() + off, upto - off)));
      off = upto;
    }
  });
  bool ok = true;
  int err = 0;
  for (size_t off = 0; off < out.size(); off += kPiece) {
    if (!read(off)) {
      ok = false;
      err = errno;
      ready.store(kFailed, std::memory_order_release);
      ready.notify_one();
      break;
    }
    ready.store(off + piece(off), std::memory_order_release);
    ready.notify_one();
  }
  hasher.join();
  errno = err;
  if (ok) hash = stream.Digest();
  return ok;
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status DiskTierOptions::Validate() const {
  if (dir.empty()) return absl::InvalidArgumentError("disk tier: no directory");
  if (max_bytes == 0) return absl::InvalidArgumentError("disk tier: the byte cap is 0");
  if (max_queued_bytes == 0) return absl::InvalidArgumentError("disk tier: the write queue cap is 0");
  return absl::OkStatus();
}

StatusOr<std::shared_ptr<const CacheDirLock>> CacheDirLock::Acquire(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("cache dir: no directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), StrCat("cache dir ", dir, ": cannot create it"));
  const std::string lock_path = (fs::path(dir) / "LOCK").string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, StrCat("cache dir ", dir, ": cannot open LOCK"));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    (void)::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(StrCat("cache dir ", dir, " is in use by another process (pid ",
                                                  std::string_view(pid).substr(0, std::string_view(pid).find('\n')),
                                                  "); give each server its own --cache-dir"));
    }
    return ErrnoStatus(err, StrCat("cache dir ", dir, ": cannot lock"));
  }
  const std::string me = StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, StrCat("cache dir ", dir, " is not writable"));
  }
  return std::shared_ptr<const CacheDirLock>(new CacheDirLock(dir, fd));
}

CacheDirLock::~CacheDirLock() { ::close(fd_); }

StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options, const CacheConfigIdentity& identity,
                                                   std::shared_ptr<const CacheDirLock> lock) {
  SKIPPY_RETURN_IF_ERROR(options.Validate());
  SKIPPY_RETURN_IF_ERROR(identity.Validate());
  if (lock && lock->dir() != options.dir) {
    return absl::InvalidArgumentError(StrCat("disk tier: the lock held is ", lock->dir(), "'s, not ", options.dir, "'s"));
  }
  std::error_code ec;
  for (const char* sub : {"entries", "tmp"}) {
    fs::create_directories(fs::path(options.dir) / sub, ec);
    if (ec) return ErrnoStatus(ec.value(), StrCat("cache dir ", options.dir, ": cannot create ", sub, "/"));
  }
  if (!lock) {
    SKIPPY_ASSIGN_OR_RETURN(lock, CacheDirLock::Acquire(options.dir));
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(options, identity, std::move(lock)));
  SKIPPY_RETURN_IF_ERROR(tier->Load());
  tier->writer_.Start([t = tier.get()](TierWriter::Pending p) { t->Write(std::move(p)); });
  return tier;
}

DiskTier::DiskTier(const DiskTierOptions& options, const CacheConfigIdentity& identity,
                   std::shared_ptr<const CacheDirLock> lock)
    : options_(options),
      identity_(identity),
      identity_encoding_(PrefixScope{identity, ""}.CanonicalEncoding()),
      lock_(std::move(lock)),
      writer_(options.max_queued_bytes) {
  stats_.dir = options.dir;
  stats_.capacity_bytes = options.max_bytes;
}

DiskTier::~DiskTier() {
  writer_.Stop();  // writes what is queued; then lock_, a member, drops this tier's reference
}

PrefixScope DiskTier::ScopeOf(const std::string& ns) const { return PrefixScope{identity_, ns}; }

Status DiskTier::Load() {
  const fs::path dir(options_.dir);
  std::error_code ec;
  // Leftovers of writes cut short (a crash between create and rename): never entries.
  for (const auto& f : fs::directory_iterator(dir / "tmp", ec)) {
    std::error_code rm;
    fs::remove(f.path(), rm);
    ++stats_.corrupt;
  }
  if (ec) return ErrnoStatus(ec.value(), StrCat("cache dir ", options_.dir, ": cannot list tmp/"));
  // The directory must take a write now, not at the first record.
  const std::string probe = (dir / "tmp" / StrCat("probe.", ::getpid())).string();
  const int pfd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (pfd < 0 || !WriteAll(pfd, "ok", 2) || ::fsync(pfd) != 0) {
    const int err = errno;
    if (pfd >= 0) ::close(pfd);
    ::unlink(probe.c_str());
    return ErrnoStatus(err, StrCat("cache dir ", options_.dir, " is not writable"));
  }
  ::close(pfd);
  ::unlink(probe.c_str());

  struct Found {
    fs::file_time_type mtime;
    std::string file;
    uint64_t size = 0;
    std::optional<EntryHead> header;  // nullopt: foreign
  };
  std::vector<Found> found;
  for (const auto& f : fs::directory_iterator(dir / "entries", ec)) {
    const std::string name = f.path().filename().string();
    std::error_code st;
    if (!f.is_regular_file(st) || !name.ends_with(kSuffix)) continue;
    const int fd = ::open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
    struct stat sb {};
    StatusOr<EntryHead> h = absl::DataLossError("unreadable entry");
    if (fd >= 0 && ::fstat(fd, &sb) == 0) h = ReadHeader(fd, static_cast<uint64_t>(sb.st_size));
    if (fd >= 0) ::close(fd);
    if (h.ok() && h->identity == identity_encoding_ && !ValidateTokens(identity_, h->record.tokens).ok()) {
      h = absl::DataLossError("token outside the vocabulary");
    }
    if (!h.ok()) {
      std::error_code rm;
      fs::remove(f.path(), rm);
      ++stats_.corrupt;
      continue;
    }
    Found e{f.last_write_time(st), name, static_cast<uint64_t>(sb.st_size), std::nullopt};
    if (h->identity == identity_encoding_) e.header = std::move(*h);
    found.push_back(std::move(e));
  }
  if (ec) return ErrnoStatus(ec.value(), StrCat("cache dir ", options_.dir, ": cannot list entries/"));
  // Oldest first, so the index's recency order starts as the files' write order.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.mtime != b.mtime ? a.mtime < b.mtime : a.file < b.file;
  });
  std::lock_guard<std::mutex> lock(mu_);
  for (Found& f : found) {
    bytes_ += f.size;
    if (!f.header) {
      foreign_.push_back({f.file, f.size});
      continue;
    }
    const PrefixRecord& r = f.header->record;
    EntryDesc desc;
    desc.kind = r.kind;
    desc.bytes = f.size;
    desc.exact_only = r.exact_only;
    desc.recompute_cost = static_cast<double>(r.tokens.size());
    auto id = index_.Insert(ScopeOf(r.tenant_namespace), r.tokens, desc);
    if (!id.ok()) {  // the same entry twice (cannot happen with content-keyed names): drop this copy
      bytes_ -= f.size;
      std::error_code rm;
      fs::remove(dir / "entries" / f.file, rm);
      continue;
    }
    stored_[*id] = Stored{f.file, r.tenant_namespace, f.size, r.exact_only, r.classes};
    ++stats_.loaded_at_open;
  }
  return absl::OkStatus();
}

std::optional<TierHit> DiskTier::Lookup(const std::string& ns, std::span<const Token> tokens) {
  if (tokens.empty()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  const LookupResult r = index_.Lookup(ScopeOf(ns), tokens, /*pin=*/false);
  if (!r.match) {
    ++(r.miss_reason == MissReason::kEvicted ? stats_.misses_evicted : stats_.misses_never_seen);
    return std::nullopt;
  }
  auto it = stored_.find(r.match->entry.id);
  if (it == stored_.end()) return std::nullopt;
  TierHit hit;
  hit.entry = r.match->entry.id;
  hit.usable_tokens = r.match->usable_tokens;
  hit.stored_bytes = it->second.file_bytes;
  hit.record.tenant_namespace = ns;
  hit.record.tokens = index_.TokensOf(hit.entry);
  hit.record.kind = r.match->entry.desc.kind;
  hit.record.exact_only = it->second.exact_only;
  hit.record.classes = it->second.classes;
  return hit;
}

Status DiskTier::Read(const TierHit& hit, std::vector<uint8_t>& out) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = stored_.find(hit.entry);
    if (it == stored_.end()) {
      ++stats_.misses_gone;
      return absl::NotFoundError("disk entry removed since its lookup");
    }
    path = (fs::path(options_.dir) / "entries" / it->second.file).string();
  }
  auto fail = [&](Status s, bool corrupt) -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (corrupt) {
      ++stats_.corrupt;
      if (stored_.count(hit.entry)) RemoveLocked(hit.entry, /*evicted=*/false);
    } else {
      ++stats_.read_errors;
    }
    return s;
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      // Evicted by the writer thread since the lookup above (the lookup does not pin): gone, not
      // corrupt. Missing while still listed: corrupt.
      std::unique_lock<std::mutex> lock(mu_);
      if (!stored_.count(hit.entry)) {
        ++stats_.misses_gone;
        return absl::NotFoundError("disk entry removed since its lookup");
      }
      lock.unlock();
      return fail(absl::DataLossError("disk entry file is missing"), true);
    }
    return fail(ErrnoStatus(err, "open " + path), false);
  }
  struct stat sb {};
  StatusOr<EntryHead> h = absl::DataLossError("unreadable disk entry");
  if (::fstat(fd, &sb) == 0) h = ReadHeader(fd, static_cast<uint64_t>(sb.st_size));
  bool read_ok = h.ok();
  int err = 0;
  Hash128Value payload_hash;
  if (read_ok) {
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a larger readahead window
    out.resize(h->payload_len);
    const uint64_t at = static_cast<uint64_t>(sb.st_size) - h->payload_len;
    read_ok = ReadHashed(fd, at, out, payload_hash);
    err = errno;
  }
  ::close(fd);
  if (!h.ok()) return fail(h.status(), true);
  if (!read_ok) {
    if (err == 0) return fail(absl::DataLossError("disk entry shorter than its header says"), true);
    return fail(ErrnoStatus(err, "read " + path), false);
  }
  // The file must still be the entry looked up, with the bytes its header vouches for.
  if (h->identity != identity_encoding_ || h->record.tenant_namespace != hit.record.tenant_namespace ||
      h->record.tokens != hit.record.tokens || h->record.kind != hit.record.kind ||
      h->record.exact_only != hit.record.exact_only || !(h->record.classes == hit.record.classes)) {
    {
      // Evicted and its name written again (the name does not cover the classes) since the lookup.
      std::lock_guard<std::mutex> lock(mu_);
      if (!stored_.count(hit.entry)) {
        ++stats_.misses_gone;
        return absl::NotFoundError("disk entry replaced since its lookup");
      }
    }
    return fail(absl::DataLossError("disk entry does not hold the prefix it was indexed as"), true);
  }
  if (payload_hash != h->payload_hash) return fail(absl::DataLossError("disk entry payload checksum mismatch"), true);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.hits;
  stats_.read_ms += MsSince(t0);
  return absl::OkStatus();
}

bool DiskTier::Put(PrefixRecord record, std::vector<uint8_t> bytes) {
  if (record.tokens.empty() || bytes.empty()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.FindExact(ScopeOf(record.tenant_namespace), record.tokens, record.kind)) {
      ++stats_.write_skips;
      return false;
    }
    const uint64_t epoch = epochs_.Of(record.tenant_namespace);
    if (bytes.size() > options_.max_bytes || !writer_.Enqueue({std::move(record), std::move(bytes), epoch})) {
      ++stats_.write_drops;
      return false;
    }
  }
  return true;
}

void DiskTier::Flush() { writer_.Flush(); }

void DiskTier::Write(TierWriter::Pending p) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir(options_.dir);
  const PrefixRecord& r = p.record;
  // Header and payload are written one after the other: the payload is not copied again.
  const std::string head = EncodeEntryHead(
      kFormat, EntryHead{identity_encoding_, r, p.bytes.size(), Hash128(std::as_bytes(std::span(p.bytes))), {}});
  const uint64_t file_bytes = head.size() + p.bytes.size();
  // Content-keyed name: the same prefix of the same identity always lands in the same file.
  const std::string name = StrCat(HexOf(EntryKey(identity_encoding_, r)), kSuffix);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (epochs_.Of(r.tenant_namespace) != p.epoch ||
        index_.FindExact(ScopeOf(r.tenant_namespace), r.tokens, r.kind)) {
      ++stats_.write_skips;
      return;
    }
    if (!MakeRoom(file_bytes)) {
      ++stats_.write_drops;
      return;
    }
  }
  struct statvfs vfs {};
  if (::statvfs(options_.dir.c_str(), &vfs) == 0 &&
      uint64_t{vfs.f_bavail} * vfs.f_frsize < file_bytes + options_.min_free_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.no_space;
    return;
  }
  const std::string tmp = (dir / "tmp" / StrCat(name, ".", ::getpid(), ".tmp")).string();
  const std::string final_path = (dir / "entries" / name).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && WriteAll(fd, head.data(), head.size()) &&
            WriteAll(fd, reinterpret_cast<const char*>(p.bytes.data()), p.bytes.size()) && ::fdatasync(fd) == 0;
  if (fd >= 0) ::close(fd);
  const bool renamed = ok && ::rename(tmp.c_str(), final_path.c_str()) == 0;
  if (!renamed || !SyncDir((dir / "entries").string()).ok()) {
    // A file renamed into entries/ but not indexed would be neither counted against the cap nor
    // evicted: a directory whose fsync fails at every write would grow without bound.
    ::unlink(renamed ? final_path.c_str() : tmp.c_str());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.write_errors;
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  EntryDesc desc;
  desc.kind = r.kind;
  desc.bytes = file_bytes;
  desc.exact_only = r.exact_only;
  desc.recompute_cost = static_cast<double>(r.tokens.size());
  auto id = epochs_.Of(r.tenant_namespace) == p.epoch ? index_.Insert(ScopeOf(r.tenant_namespace), r.tokens, desc)
                                                           : StatusOr<EntryId>(absl::AbortedError("cleared"));
  if (!id.ok()) {  // cleared while it was written
    ::unlink(final_path.c_str());
    ++stats_.write_skips;
    return;
  }
  stored_[*id] = Stored{name, r.tenant_namespace, file_bytes, r.exact_only, r.classes};
  bytes_ += file_bytes;
  ++stats_.writes;
  stats_.write_ms += MsSince(t0);
}

bool DiskTier::MakeRoom(uint64_t incoming) {
  if (incoming > options_.max_bytes) return false;
  while (bytes_ + incoming > options_.max_bytes && !foreign_.empty()) {
    const Foreign f = foreign_.front();
    foreign_.pop_front();
    ::unlink((fs::path(options_.dir) / "entries" / f.file).c_str());
    bytes_ -= f.file_bytes;
    ++stats_.evictions;
  }
  while (bytes_ + incoming > options_.max_bytes) {
    std::optional<EntryId> victim;
    index_.ForEachEvictable([&](const EntryInfo& e) {
      victim = e.id;
      return false;
    });
    if (!victim) return false;
    RemoveLocked(*victim, /*evicted=*/true);
    ++stats_.evictions;
  }
  return true;
}

void DiskTier::RemoveLocked(EntryId id, bool evicted) {
  auto it = stored_.find(id);
  if (it == stored_.end()) return;
  ::unlink((fs::path(options_.dir) / "entries" / it->second.file).c_str());
  bytes_ -= it->second.file_bytes;
  stored_.erase(it);
  (void)index_.Erase(id, evicted);
}

size_t DiskTier::Clear(const std::optional<std::string>& ns) {
  std::lock_guard<std::mutex> lock(mu_);
  epochs_.Raise(ns);
  std::vector<EntryId> ids;
  for (const auto& [id, s] : stored_) {
    if (!ns || s.tenant_namespace == *ns) ids.push_back(id);
  }
  for (EntryId id : ids) RemoveLocked(id, /*evicted=*/false);
  return ids.size();
}

DiskTierStats DiskTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskTierStats s = stats_;
  s.queued_bytes = writer_.queued_bytes();
  s.entries = stored_.size();
  s.bytes = bytes_;
  s.foreign_entries = foreign_.size();
  s.foreign_bytes = 0;
  for (const Foreign& f : foreign_) s.foreign_bytes += f.file_bytes;
  return s;
}

}  // namespace skippy::cache
