#include "skippy/cache/cache.h"

namespace skippy::cache {
namespace {

Status ValidateRequest(const PrefixScope& scope, std::span<const Token> tokens) {
  SKIPPY_RETURN_IF_ERROR(scope.Validate());
  return ValidateTokens(scope.config, tokens);
}

}  // namespace

StatusOr<std::unique_ptr<Cache>> Cache::Create(const CacheOptions& options) {
  SKIPPY_ASSIGN_OR_RETURN(std::unique_ptr<ResidentPool> pool, ResidentPool::Create(options.pool));
  return std::unique_ptr<Cache>(new Cache(std::move(pool), options.decoded));
}

Cache::Cache(std::unique_ptr<ResidentPool> pool, const DecodedResultOptions& decoded)
    : pool_(std::move(pool)), decoded_(decoded) {}

StatusOr<LookupResult> Cache::Lookup(const PrefixScope& scope, std::span<const Token> tokens) {
  SKIPPY_RETURN_IF_ERROR(ValidateRequest(scope, tokens));
  std::lock_guard lock(mu_);
  return pool_->Lookup(scope, tokens, /*pin=*/true);
}

StatusOr<LookupResult> Cache::Peek(const PrefixScope& scope, std::span<const Token> tokens) const {
  SKIPPY_RETURN_IF_ERROR(ValidateRequest(scope, tokens));
  std::lock_guard lock(mu_);
  return pool_->Peek(scope, tokens);
}

StatusOr<std::optional<EntryInfo>> Cache::Release(EntryId id) {
  std::lock_guard lock(mu_);
  return pool_->Release(id);
}

Status Cache::Pin(EntryId id) {
  std::lock_guard lock(mu_);
  return pool_->Pin(id);
}

StatusOr<Reservation> Cache::Reserve(const PrefixScope& scope, std::span<const Token> tokens,
                                     const RecordRequest& request) {
  SKIPPY_RETURN_IF_ERROR(ValidateRequest(scope, tokens));
  std::lock_guard lock(mu_);
  return pool_->Reserve(scope, tokens, request);
}

StatusOr<EntryId> Cache::Commit(ReservationId id, uint64_t payload_id) {
  std::lock_guard lock(mu_);
  return pool_->Commit(id, payload_id);
}

Status Cache::Abort(ReservationId id) {
  std::lock_guard lock(mu_);
  return pool_->Abort(id);
}

StatusOr<std::optional<EntryInfo>> Cache::Erase(EntryId id) {
  std::lock_guard lock(mu_);
  return pool_->Erase(id);
}

Status Cache::PutDecoded(const PrefixScope& scope, std::span<const Token> tokens, std::vector<float> last_logits) {
  SKIPPY_RETURN_IF_ERROR(ValidateRequest(scope, tokens));
  std::lock_guard lock(mu_);
  return decoded_.Put(scope, tokens, std::move(last_logits));
}

StatusOr<std::shared_ptr<const DecodedResult>> Cache::GetDecoded(const PrefixScope& scope,
                                                                 std::span<const Token> tokens) {
  SKIPPY_RETURN_IF_ERROR(ValidateRequest(scope, tokens));
  std::lock_guard lock(mu_);
  return decoded_.Get(scope, tokens);
}

CacheStats Cache::Stats() const {
  std::lock_guard lock(mu_);
  return {pool_->Stats(), decoded_.Stats()};
}

Status Cache::CheckInvariants() const {
  std::lock_guard lock(mu_);
  return pool_->CheckInvariants();
}

}  // namespace skippy::cache
