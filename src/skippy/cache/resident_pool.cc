#include "skippy/cache/resident_pool.h"

#include <algorithm>
#include <string>

namespace skippy::cache {

Status ResidentPoolOptions::Validate() const {
  if (max_entries == 0 || max_bytes == 0 || max_tokens == 0) {
    return absl::InvalidArgumentError("resident pool: every cap (entries, bytes, tokens) must be > 0");
  }
  if (lane_count < 0) return absl::InvalidArgumentError("resident pool: lane_count < 0");
  if (seq_id_begin > seq_id_end) {
    return absl::InvalidArgumentError("resident pool: empty sequence id range [" +
                                      std::to_string(seq_id_begin) + ", " +
                                      std::to_string(seq_id_end) + ")");
  }
  if (seq_id_begin < lane_count) {
    return absl::InvalidArgumentError("resident pool: cache sequence ids [" + std::to_string(seq_id_begin) +
                                      ", " + std::to_string(seq_id_end) + ") collide with lane ids [0, " +
                                      std::to_string(lane_count) + ")");
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<ResidentPool>> ResidentPool::Create(const ResidentPoolOptions& options) {
  SKIPPY_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<ResidentPool>(new ResidentPool(options));
}

ResidentPool::ResidentPool(const ResidentPoolOptions& options)
    : options_(options), index_(options.index) {
  for (int32_t s = options.seq_id_begin; s < options.seq_id_end; ++s) free_seqs_.insert(s);
}

void ResidentPool::FreeResources(const EntryInfo& info) {
  --held_entries_;
  held_tokens_ -= info.tokens;
  held_bytes_ -= info.desc.bytes;
  if (info.desc.seq_id != kNoSequence) held_resident_tokens_ -= info.tokens;
  if (SequenceOwned(info.desc.seq_id)) free_seqs_.insert(info.desc.seq_id);
}

StatusOr<Reservation> ResidentPool::Reserve(const PrefixScope& scope, std::span<const Token> tokens,
                                            const RecordRequest& request) {
  SKIPPY_RETURN_IF_ERROR(scope.Validate());
  SKIPPY_RETURN_IF_ERROR(ValidateTokens(scope.config, tokens));
  if (request.bytes > options_.max_bytes) {
    return absl::InvalidArgumentError("entry of " + std::to_string(request.bytes) +
                                      " bytes is larger than the whole pool cap of " +
                                      std::to_string(options_.max_bytes) + " bytes");
  }
  if (request.needs_sequence && tokens.size() > options_.max_tokens) {
    return absl::InvalidArgumentError("entry of " + std::to_string(tokens.size()) +
                                      " tokens is larger than the whole pool cap of " +
                                      std::to_string(options_.max_tokens) + " tokens");
  }
  // Exact duplicates: an entry of this kind already at this boundary, or one being recorded.
  if (std::optional<EntryId> dup = index_.FindExact(scope, tokens, request.kind)) {
    return absl::FailedPreconditionError("an entry of kind " + std::string(PayloadKindName(request.kind)) +
                                         " is already cached at this " + std::to_string(tokens.size()) +
                                         "-token boundary (entry " + std::to_string(*dup) + ")");
  }
  for (const auto& [rid, p] : pending_) {
    if (p.request.kind == request.kind && p.tokens.size() == tokens.size() && p.scope == scope &&
        std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin())) {
      return absl::FailedPreconditionError("this " + std::to_string(tokens.size()) +
                                           "-token prefix is already being recorded (reservation " +
                                           std::to_string(rid) + ")");
    }
  }

  if (request.needs_sequence && options_.seq_id_begin == options_.seq_id_end) {
    return absl::FailedPreconditionError("this pool has no cache sequences: record payloads in the payload store");
  }
  // Plan evictions without changing anything. The token cap and the sequences bind only entries
  // that hold a cache sequence; an entry without one is evicted only for the entry or byte cap.
  const bool need_seq = request.needs_sequence;
  size_t entries = held_entries_ + reserved_entries_ + 1;
  size_t ntok = held_resident_tokens_ + reserved_resident_tokens_ + (need_seq ? tokens.size() : 0);
  uint64_t bytes = held_bytes_ + reserved_bytes_ + request.bytes;
  size_t seqs = free_seqs_.size();
  auto shared_caps_fit = [&] { return entries <= options_.max_entries && bytes <= options_.max_bytes; };
  auto fits = [&] { return shared_caps_fit() && ntok <= options_.max_tokens && (!need_seq || seqs > 0); };
  std::vector<EntryId> victims;
  if (!fits()) {
    index_.ForEachEvictable([&](const EntryInfo& e) {
      const bool holds_seq = e.desc.seq_id != kNoSequence;
      if (!holds_seq && shared_caps_fit()) return true;  // would not help: skip it
      victims.push_back(e.id);
      --entries;
      bytes -= e.desc.bytes;
      if (holds_seq) ntok -= e.tokens;
      if (SequenceOwned(e.desc.seq_id)) ++seqs;
      return !fits();
    });
  }
  if (!fits()) {
    ++reserve_failures_;
    return absl::ResourceExhaustedError(
        "resident pool is full: pinned entries and open reservations leave no room for " +
        std::to_string(tokens.size()) + " tokens / " + std::to_string(request.bytes) + " bytes (" +
        std::to_string(held_entries_) + " entries held, " + std::to_string(reserved_entries_) +
        " reserved, " + std::to_string(free_seqs_.size()) + " free sequences)");
  }

  Reservation r;
  for (EntryId v : victims) {
    StatusOr<std::optional<EntryInfo>> freed = index_.Erase(v, /*evicted=*/true);
    if (!freed.ok() || !freed->has_value()) return absl::InternalError("evicted entry was not freed");
    FreeResources(**freed);
    r.evictions.push_back(**freed);
  }
  Pending p;
  p.scope = scope;
  p.tokens.assign(tokens.begin(), tokens.end());
  p.request = request;
  if (need_seq) {
    p.seq_id = *free_seqs_.begin();
    free_seqs_.erase(free_seqs_.begin());
  }
  r.id = next_reservation_++;
  r.seq_id = p.seq_id;
  ++reserved_entries_;
  reserved_tokens_ += tokens.size();
  if (need_seq) reserved_resident_tokens_ += tokens.size();
  reserved_bytes_ += request.bytes;
  pending_.emplace(r.id, std::move(p));
  return r;
}

StatusOr<EntryId> ResidentPool::Commit(ReservationId id, uint64_t payload_id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return absl::NotFoundError("commit: no open reservation " + std::to_string(id));
  Pending& p = it->second;
  EntryDesc desc;
  desc.kind = p.request.kind;
  desc.bytes = p.request.bytes;
  desc.seq_id = p.seq_id;
  desc.payload_id = payload_id;
  desc.recompute_cost = p.request.recompute_cost;
  desc.exact_only = p.request.exact_only;
  SKIPPY_ASSIGN_OR_RETURN(EntryId entry, index_.Insert(p.scope, p.tokens, desc));
  --reserved_entries_;
  reserved_tokens_ -= p.tokens.size();
  reserved_bytes_ -= p.request.bytes;
  ++held_entries_;
  held_tokens_ += p.tokens.size();
  held_bytes_ += p.request.bytes;
  if (p.request.needs_sequence) {
    reserved_resident_tokens_ -= p.tokens.size();
    held_resident_tokens_ += p.tokens.size();
  }
  pending_.erase(it);
  return entry;
}

Status ResidentPool::Abort(ReservationId id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return absl::NotFoundError("abort: no open reservation " + std::to_string(id));
  Pending& p = it->second;
  if (p.seq_id != kNoSequence) free_seqs_.insert(p.seq_id);
  --reserved_entries_;
  reserved_tokens_ -= p.tokens.size();
  if (p.request.needs_sequence) reserved_resident_tokens_ -= p.tokens.size();
  reserved_bytes_ -= p.request.bytes;
  pending_.erase(it);
  return absl::OkStatus();
}

LookupResult ResidentPool::Lookup(const PrefixScope& scope, std::span<const Token> tokens, bool pin) {
  return index_.Lookup(scope, tokens, pin);
}

LookupResult ResidentPool::Peek(const PrefixScope& scope, std::span<const Token> tokens) const {
  return index_.Peek(scope, tokens);
}

Status ResidentPool::Pin(EntryId id) { return index_.Pin(id); }

StatusOr<std::optional<EntryInfo>> ResidentPool::Release(EntryId id) {
  SKIPPY_ASSIGN_OR_RETURN(std::optional<EntryInfo> freed, index_.Unpin(id));
  if (freed) FreeResources(*freed);
  return freed;
}

StatusOr<std::optional<EntryInfo>> ResidentPool::Erase(EntryId id) {
  SKIPPY_ASSIGN_OR_RETURN(std::optional<EntryInfo> freed, index_.Erase(id, /*evicted=*/false));
  if (freed) FreeResources(*freed);
  return freed;
}

PoolStats ResidentPool::Stats() const {
  PoolStats s;
  s.index = index_.Stats();
  s.reserved_entries = reserved_entries_;
  s.reserved_tokens = reserved_tokens_;
  s.reserved_bytes = reserved_bytes_;
  s.used_entries = held_entries_ + reserved_entries_;
  s.used_tokens = held_tokens_ + reserved_tokens_;
  s.resident_tokens = held_resident_tokens_ + reserved_resident_tokens_;
  s.used_bytes = held_bytes_ + reserved_bytes_;
  s.free_sequences = free_seqs_.size();
  s.reserve_failures = reserve_failures_;
  return s;
}

Status ResidentPool::CheckInvariants() const {
  SKIPPY_RETURN_IF_ERROR(index_.CheckInvariants());
  RadixStats st = index_.Stats();
  if (st.entries + st.zombie_entries != held_entries_ || st.tokens + st.zombie_tokens != held_tokens_ ||
      st.bytes + st.zombie_bytes != held_bytes_) {
    return absl::InternalError("pool: held accounting differs from the index");
  }
  if (held_entries_ + reserved_entries_ > options_.max_entries ||
      held_resident_tokens_ + reserved_resident_tokens_ > options_.max_tokens ||
      held_bytes_ + reserved_bytes_ > options_.max_bytes) {
    return absl::InternalError("pool: a cap is exceeded");
  }
  size_t seq_users = 0;
  for (const auto& [id, p] : pending_) seq_users += p.seq_id != kNoSequence;
  // Sequences in use by entries are not tracked separately; check the total from the other side.
  size_t total = static_cast<size_t>(options_.seq_id_end - options_.seq_id_begin);
  if (free_seqs_.size() + seq_users > total) return absl::InternalError("pool: sequence accounting");
  return absl::OkStatus();
}

}  // namespace skippy::cache
