// PayloadStore implementation notes.
//
// Put is the only tricky path, because it must either fully succeed or change nothing:
//   1. Hash every block outside the main critical section, copying each block that is not yet
//      indexed into a spare buffer right after hashing it (the block is still in cache, so the
//      input is read from memory once). Copies are speculative: nothing is published yet.
//   2. Under the lock, resolve each block: an existing block with equal hash *and* equal bytes, a
//      block repeated earlier in this payload, or a new block. The new blocks' size is what the
//      payload adds to physical bytes.
//   3. If that does not fit under the cap, dry-run eviction in LRU order on a scratch copy of the
//      reference counts, where every existing block the new payload will share carries one extra
//      reference (so eviction can never free a block the new payload is about to point at). Only if
//      the dry run reaches the target are the victims actually evicted.
//   4. Take references on shared blocks, evict the victims, publish the new blocks (using the
//      speculative copies; unused copies return to the spare list).
// Freed full-size blocks go to a small spare list so that steady-state Puts do not page-fault on
// fresh 1 MiB allocations (that, not hashing, is what would dominate throughput).
#include "skippy/cache/payload_store.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // same XXH3 values, AVX2/AVX-512 chosen at run time
#endif

namespace skippy::cache {
namespace {

struct Block {
  std::unique_ptr<std::byte[]> data;
  size_t size = 0;
  size_t capacity = 0;
  Hash128Value hash;
  uint64_t domain = 0;  // the dedup domain of the payloads that share it
  uint32_t refs = 0;
};

struct Payload {
  std::vector<Block*> blocks;
  size_t size = 0;
  uint32_t pins = 0;
  bool released = false;
  uint64_t last_use = 0;
  PayloadTier::OnEvict on_evict;  // told when the cap evicts it
};

// XXH3-128 of a block; equal to skippy::Hash128(bytes) (CheckInvariants verifies this), but using
// libxxhash's runtime-dispatched SIMD kernel, which is what keeps Put near memcpy speed.
Hash128Value BlockHash(std::span<const std::byte> bytes) {
#if defined(__x86_64__)
  XXH128_hash_t h = XXH3_128bits_withSeed_dispatch(bytes.data(), bytes.size(), 0);
#else
  XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), 0);
#endif
  return {h.low64, h.high64};
}

// Copies `src` to `dst` and returns BlockHash(src), touching each 64 KiB piece of `src` once.
Hash128Value CopyAndHash(std::byte* dst, std::span<const std::byte> src) {
  constexpr size_t kPiece = size_t{64} << 10;
  if (src.size() <= kPiece) {
    std::memcpy(dst, src.data(), src.size());
    return BlockHash(std::span<const std::byte>(dst, src.size()));
  }
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  for (size_t off = 0; off < src.size(); off += kPiece) {
    size_t len = std::min(kPiece, src.size() - off);
    std::memcpy(dst + off, src.data() + off, len);
#if defined(__x86_64__)
    XXH3_128bits_update_dispatch(&state, dst + off, len);
#else
    XXH3_128bits_update(&state, dst + off, len);
#endif
  }
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.low64, h.high64};
}

struct HashOf {
  size_t operator()(const Hash128Value& h) const { return static_cast<size_t>(h.low ^ (h.high * 0x9E3779B97F4A7C15ull)); }
};

}  // namespace

struct PayloadStore::Impl {
  PayloadStoreOptions options;
  absl::flat_hash_map<Hash128Value, absl::InlinedVector<Block*, 1>, HashOf> blocks;
  absl::flat_hash_map<PayloadId, Payload> payloads;
  std::set<std::pair<uint64_t, PayloadId>> lru;  // unpinned, unreleased payloads
  std::vector<std::unique_ptr<std::byte[]>> spare;
  PayloadId next_id = 1;
  uint64_t clock = 0;
  PayloadStats stats;

  Payload* Get(PayloadId id) {
    auto it = payloads.find(id);
    return it == payloads.end() ? nullptr : &it->second;
  }

  std::unique_ptr<std::byte[]> Allocate(size_t size, size_t* capacity) {
    if (size == options.block_size && !spare.empty()) {
      auto buf = std::move(spare.back());
      spare.pop_back();
      *capacity = options.block_size;
      return buf;
    }
    *capacity = size;
    return std::unique_ptr<std::byte[]>(new std::byte[size]);
  }

  void Recycle(std::unique_ptr<std::byte[]> buf, size_t capacity) {
    if (capacity == options.block_size && spare.size() < options.max_spare_blocks) {
      spare.push_back(std::move(buf));
    }
  }

  void Unref(Block* b) {
    if (--b->refs > 0) return;
    auto it = blocks.find(b->hash);
    auto& chain = it->second;
    chain.erase(std::find(chain.begin(), chain.end(), b));
    stats.physical_bytes -= b->size;
    --stats.blocks;
    Recycle(std::move(b->data), b->capacity);
    if (chain.empty()) blocks.erase(it);
    delete b;
  }

  // Frees a payload that is unpinned.
  void Free(PayloadId id) {
    auto it = payloads.find(id);
    Payload& p = it->second;
    if (!p.released) lru.erase({p.last_use, id});
    stats.logical_bytes -= p.size;
    --stats.payloads;
    for (Block* b : p.blocks) Unref(b);
    payloads.erase(it);
  }

  void Touch(PayloadId id, Payload& p) {
    bool listed = p.pins == 0 && !p.released;
    if (listed) lru.erase({p.last_use, id});
    p.last_use = ++clock;
    if (listed) lru.insert({p.last_use, id});
  }
};

Status PayloadStoreOptions::Validate() const {
  if (block_size == 0) return absl::InvalidArgumentError("payload store: block_size must be > 0");
  if (max_physical_bytes == 0) return absl::InvalidArgumentError("payload store: max_physical_bytes must be > 0");
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<PayloadStore>> PayloadStore::Create(const PayloadStoreOptions& options) {
  SKIPPY_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<PayloadStore>(new PayloadStore(options));
}

PayloadStore::PayloadStore(const PayloadStoreOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
}

PayloadStore::~PayloadStore() {
  std::lock_guard lock(mu_);
  for (auto& [h, chain] : impl_->blocks) {
    for (Block* b : chain) delete b;
  }
}

StatusOr<PutResult> PayloadStore::Put(std::span<const std::byte> bytes, OnEvict on_evict, uint64_t domain) {
  if (bytes.empty()) return absl::InvalidArgumentError("payload store: cannot store an empty payload");
  const size_t bs = impl_->options.block_size;  // immutable after construction
  const size_t n = (bytes.size() + bs - 1) / bs;
  Impl& m = *impl_;
  // Phase A, block by block: copy into a spare buffer and hash in 64 KiB pieces, each piece
  // hashed right after it is copied while it is still in L1/L2, so the input is read from memory
  // once. The copies are speculative: phase B recycles those that turn out to be duplicates.
  std::vector<Hash128Value> hashes(n);
  std::vector<std::unique_ptr<std::byte[]>> copies(n);
  std::vector<size_t> capacities(n, 0);
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < n; ++i) copies[i] = m.Allocate(std::min(bs, bytes.size() - i * bs), &capacities[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    std::span<const std::byte> blk = bytes.subspan(i * bs, std::min(bs, bytes.size() - i * bs));
    hashes[i] = CopyAndHash(copies[i].get(), blk);
  }
  // The owners of evicted payloads are told after the lock is released (declared before it, so
  // destroyed after it): their callbacks may call the store.
  struct NotifyAfterUnlock {
    std::vector<std::pair<OnEvict, PayloadId>> calls;
    ~NotifyAfterUnlock() {
      for (auto& [f, id] : calls) f(id);
    }
  } notify;
  std::lock_guard lock(mu_);
  // Speculative copies not used by the end of this call go back to the spare list.
  struct RecycleRest {
    Impl& m;
    std::vector<std::unique_ptr<std::byte[]>>& copies;
    std::vector<size_t>& capacities;
    ~RecycleRest() {
      for (size_t i = 0; i < copies.size(); ++i) {
        if (copies[i]) m.Recycle(std::move(copies[i]), capacities[i]);
      }
    }
  } recycle_rest{m, copies, capacities};
  // Resolve: existing block, earlier block of this payload (index into `fresh`), or new.
  std::vector<Block*> existing(n, nullptr);
  std::vector<int64_t> repeat_of(n, -1);
  absl::flat_hash_map<Hash128Value, absl::InlinedVector<size_t, 1>, HashOf> fresh;
  uint64_t new_bytes = 0;
  size_t collisions = 0;
  for (size_t i = 0; i < n; ++i) {
    std::span<const std::byte> blk = bytes.subspan(i * bs, std::min(bs, bytes.size() - i * bs));
    if (auto it = m.blocks.find(hashes[i]); it != m.blocks.end()) {
      bool same_domain = false;
      for (Block* b : it->second) {
        if (b->domain != domain) continue;  // never shared across domains
        same_domain = true;
        if (b->size == blk.size() && std::memcmp(b->data.get(), blk.data(), blk.size()) == 0) {
          existing[i] = b;
          break;
        }
      }
      if (existing[i] == nullptr && same_domain) ++collisions;
    }
    if (existing[i] != nullptr) continue;
    auto& seen = fresh[hashes[i]];
    for (size_t j : seen) {
      std::span<const std::byte> other = bytes.subspan(j * bs, std::min(bs, bytes.size() - j * bs));
      if (other.size() == blk.size() && std::memcmp(other.data(), blk.data(), blk.size()) == 0) {
        repeat_of[i] = static_cast<int64_t>(j);
        break;
      }
    }
    if (repeat_of[i] >= 0) continue;
    if (!seen.empty()) ++collisions;
    seen.push_back(i);
    new_bytes += blk.size();
  }
  const uint64_t cap = m.options.max_physical_bytes;
  if (new_bytes > cap) {
    return absl::InvalidArgumentError("payload of " + std::to_string(bytes.size()) + " bytes (" +
                                      std::to_string(new_bytes) + " distinct) is larger than the whole store cap of " +
                                      std::to_string(cap) + " bytes");
  }
  std::vector<PayloadId> victims;
  if (m.stats.physical_bytes + new_bytes > cap) {
    absl::flat_hash_map<Block*, int64_t> refs;
    for (Block* b : existing) {
      if (b) refs.try_emplace(b, b->refs).first->second += 1;
    }
    uint64_t physical = m.stats.physical_bytes;
    for (const auto& [use, id] : m.lru) {
      victims.push_back(id);
      for (Block* b : m.payloads.find(id)->second.blocks) {
        auto [it, inserted] = refs.try_emplace(b, b->refs);
        if (--it->second == 0) physical -= b->size;
      }
      if (physical + new_bytes <= cap) break;
    }
    if (physical + new_bytes > cap) {
      return absl::ResourceExhaustedError("payload store is full: pinned payloads leave no room for " +
                                          std::to_string(new_bytes) + " new bytes (cap " +
                                          std::to_string(cap) + ", physical " +
                                          std::to_string(m.stats.physical_bytes) + ")");
    }
  }

  PutResult result;
  for (Block* b : existing) {
    if (b) ++b->refs;
  }
  for (PayloadId v : victims) {
    if (OnEvict& f = m.payloads.find(v)->second.on_evict) notify.calls.emplace_back(std::move(f), v);
    m.Free(v);
    ++m.stats.evictions;
  }
  Payload p;
  p.on_evict = std::move(on_evict);
  p.size = bytes.size();
  p.blocks.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (existing[i] != nullptr) {
      p.blocks[i] = existing[i];
      ++result.shared_blocks;
      continue;
    }
    if (repeat_of[i] >= 0) {
      p.blocks[i] = p.blocks[repeat_of[i]];
      ++p.blocks[i]->refs;
      ++result.shared_blocks;
      continue;
    }
    std::span<const std::byte> blk = bytes.subspan(i * bs, std::min(bs, bytes.size() - i * bs));
    auto* b = new Block;
    if (copies[i]) {
      b->data = std::move(copies[i]);
      b->capacity = capacities[i];
    } else {  // the phase-A probe saw an equal hash that has since gone
      b->data = m.Allocate(blk.size(), &b->capacity);
      std::memcpy(b->data.get(), blk.data(), blk.size());
    }
    b->size = blk.size();
    b->hash = hashes[i];
    b->domain = domain;
    b->refs = 1;
    m.blocks[hashes[i]].push_back(b);
    m.stats.physical_bytes += b->size;
    ++m.stats.blocks;
    ++result.new_blocks;
    p.blocks[i] = b;
  }
  result.id = m.next_id++;
  p.last_use = ++m.clock;
  m.lru.insert({p.last_use, result.id});
  m.payloads.emplace(result.id, std::move(p));
  m.stats.logical_bytes += bytes.size();
  ++m.stats.payloads;
  ++m.stats.puts;
  m.stats.shared_block_hits += result.shared_blocks;
  m.stats.hash_collisions += collisions;
  return result;
}

bool PayloadStore::Contains(PayloadId id) const {
  std::lock_guard lock(mu_);
  const Payload* p = impl_->Get(id);
  return p != nullptr && !p->released;
}

TierUsage PayloadStore::Usage() const {
  std::lock_guard lock(mu_);
  const PayloadStats& s = impl_->stats;
  return {s.payloads, s.logical_bytes, s.physical_bytes, impl_->options.max_physical_bytes, s.evictions};
}

StatusOr<size_t> PayloadStore::Size(PayloadId id) const {
  std::lock_guard lock(mu_);
  const Payload* p = impl_->Get(id);
  if (p == nullptr) return absl::NotFoundError("payload " + std::to_string(id) + " is unknown or freed");
  return p->size;
}

Status PayloadStore::Read(PayloadId id, std::span<std::byte> out) {
  std::lock_guard lock(mu_);
  Payload* p = impl_->Get(id);
  if (p == nullptr) return absl::NotFoundError("payload " + std::to_string(id) + " is unknown or freed");
  if (out.size() != p->size) {
    return absl::InvalidArgumentError("read of payload " + std::to_string(id) + ": buffer is " +
                                      std::to_string(out.size()) + " bytes, payload is " +
                                      std::to_string(p->size));
  }
  size_t off = 0;
  for (const Block* b : p->blocks) {
    std::memcpy(out.data() + off, b->data.get(), b->size);
    off += b->size;
  }
  impl_->Touch(id, *p);
  return absl::OkStatus();
}

Status PayloadStore::ReadRange(PayloadId id, size_t offset, std::span<std::byte> out) {
  std::lock_guard lock(mu_);
  Payload* p = impl_->Get(id);
  if (p == nullptr) return absl::NotFoundError("payload " + std::to_string(id) + " is unknown or freed");
  if (offset > p->size || out.size() > p->size - offset) {
    return absl::OutOfRangeError("read of bytes [" + std::to_string(offset) + ", " + std::to_string(offset + out.size()) +
                                 ") of payload " + std::to_string(id) + ", which has " + std::to_string(p->size));
  }
  size_t block_start = 0, done = 0;
  for (const Block* b : p->blocks) {
    if (done == out.size()) break;
    const size_t block_end = block_start + b->size;
    const size_t from = offset + done;
    if (from < block_end) {
      const size_t n = std::min(block_end - from, out.size() - done);
      std::memcpy(out.data() + done, b->data.get() + (from - block_start), n);
      done += n;
    }
    block_start = block_end;
  }
  impl_->Touch(id, *p);
  return absl::OkStatus();
}

StatusOr<std::vector<std::byte>> PayloadStore::Get(PayloadId id) {
  SKIPPY_ASSIGN_OR_RETURN(size_t size, Size(id));
  std::vector<std::byte> out(size);
  SKIPPY_RETURN_IF_ERROR(Read(id, out));  // NotFound if released in between
  return out;
}

Status PayloadStore::Pin(PayloadId id) {
  std::lock_guard lock(mu_);
  Payload* p = impl_->Get(id);
  if (p == nullptr) return absl::NotFoundError("pin: payload " + std::to_string(id) + " is unknown or freed");
  if (p->pins == 0 && !p->released) impl_->lru.erase({p->last_use, id});
  ++p->pins;
  return absl::OkStatus();
}

Status PayloadStore::Unpin(PayloadId id) {
  std::lock_guard lock(mu_);
  Payload* p = impl_->Get(id);
  if (p == nullptr) return absl::NotFoundError("unpin: payload " + std::to_string(id) + " is unknown or freed");
  if (p->pins == 0) {
    return absl::FailedPreconditionError("unpin: payload " + std::to_string(id) + " is not pinned (double unpin)");
  }
  --p->pins;
  if (p->pins > 0) return absl::OkStatus();
  if (p->released) {
    impl_->Free(id);
  } else {
    impl_->lru.insert({p->last_use, id});
  }
  return absl::OkStatus();
}

Status PayloadStore::Release(std::span<const PayloadId> ids) {
  std::lock_guard lock(mu_);
  Impl& m = *impl_;
  absl::flat_hash_set<PayloadId> seen;
  for (PayloadId id : ids) {
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError("release: payload " + std::to_string(id) +
                                        " appears twice in one batch; nothing was released");
    }
    const Payload* p = m.Get(id);
    if (p == nullptr) {
      return absl::NotFoundError("release: payload " + std::to_string(id) +
                                 " is unknown or already freed (double release?); nothing was released");
    }
    if (p->released) {
      return absl::FailedPreconditionError("release: payload " + std::to_string(id) +
                                           " was already released (double release); nothing was released");
    }
  }
  for (PayloadId id : ids) {
    Payload* p = m.Get(id);
    if (p->pins > 0) {
      p->released = true;  // freed by the last Unpin
    } else {
      m.Free(id);
    }
  }
  return absl::OkStatus();
}

StatusOr<std::vector<BlockDigest>> PayloadStore::BlockDigests(PayloadId id, bool with_sha256) const {
  std::lock_guard lock(mu_);
  const Payload* p = impl_->Get(id);
  if (p == nullptr) return absl::NotFoundError("payload " + std::to_string(id) + " is unknown or freed");
  std::vector<BlockDigest> out;
  out.reserve(p->blocks.size());
  for (const Block* b : p->blocks) {
    BlockDigest d;
    d.size = b->size;
    d.xxh3_128 = b->hash;
    if (with_sha256) d.sha256 = Sha256(std::span<const std::byte>(b->data.get(), b->size));
    out.push_back(d);
  }
  return out;
}

PayloadStats PayloadStore::Stats() const {
  std::lock_guard lock(mu_);
  PayloadStats s = impl_->stats;
  s.saved_bytes = s.logical_bytes - s.physical_bytes;
  s.pinned_payloads = 0;
  for (const auto& [id, p] : impl_->payloads) s.pinned_payloads += p.pins > 0;
  return s;
}

Status PayloadStore::CheckInvariants() const {
  std::lock_guard lock(mu_);
  const Impl& m = *impl_;
  absl::flat_hash_map<const Block*, uint32_t> refs;
  uint64_t logical = 0;
  size_t lru = 0;
  for (const auto& [id, p] : m.payloads) {
    logical += p.size;
    size_t sum = 0;
    for (const Block* b : p.blocks) {
      ++refs[b];
      sum += b->size;
    }
    if (sum != p.size) return absl::InternalError("store: payload size differs from its blocks");
    if (p.pins == 0 && p.released) return absl::InternalError("store: released unpinned payload kept");
    if (p.pins == 0 && !p.released) {
      ++lru;
      if (!m.lru.count({p.last_use, id})) return absl::InternalError("store: lru misses payload");
    }
  }
  if (lru != m.lru.size()) return absl::InternalError("store: lru size");
  uint64_t physical = 0;
  size_t blocks = 0;
  for (const auto& [h, chain] : m.blocks) {
    for (const Block* b : chain) {
      ++blocks;
      physical += b->size;
      if (!(b->hash == h)) return absl::InternalError("store: block under wrong hash");
      if (refs[b] != b->refs) return absl::InternalError("store: block reference count");
      if (!(Hash128(std::span<const std::byte>(b->data.get(), b->size)) == b->hash)) {
        return absl::InternalError("store: block bytes changed");
      }
    }
  }
  if (blocks != refs.size()) return absl::InternalError("store: payload points at an unindexed block");
  if (physical != m.stats.physical_bytes || blocks != m.stats.blocks || logical != m.stats.logical_bytes ||
      m.payloads.size() != m.stats.payloads) {
    return absl::InternalError("store: byte accounting");
  }
  if (physical > m.options.max_physical_bytes) return absl::InternalError("store: cap exceeded");
  return absl::OkStatus();
}

}  // namespace skippy::cache
