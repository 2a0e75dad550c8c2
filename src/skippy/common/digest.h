// Hashing, chosen once for the whole project:
//   - Sha256: cryptographic, for identities that must not collide even when an attacker chooses the
//     input (model file digests, payload block digests shown to users, tenant-visible keys).
//   - Hash64 / Hash128 (XXH3): fast non-cryptographic hashes for indexing hot paths. A match found
//     through them is always confirmed against the stored bytes or tokens by the caller.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "skippy/common/status.h"

namespace skippy {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256(std::span<const std::byte> bytes);
Sha256Digest Sha256(std::string_view bytes);
// Streams a file through SHA-256. NotFound / DataLoss on read errors.
StatusOr<Sha256Digest> Sha256File(const std::string& path);
std::string ToHex(std::span<const uint8_t> bytes);

uint64_t Hash64(std::span<const std::byte> bytes, uint64_t seed = 0);
struct Hash128Value {
  uint64_t low = 0;
  uint64_t high = 0;
  friend bool operator==(const Hash128Value&, const Hash128Value&) = default;
};
Hash128Value Hash128(std::span<const std::byte> bytes, uint64_t seed = 0);

// Hash128 of bytes given in pieces (equal to Hash128 of their concatenation, seed 0): hashing each
// piece right after it is read keeps it in cache.
class Hash128Stream {
 public:
  Hash128Stream();
  ~Hash128Stream();
  Hash128Stream(const Hash128Stream&) = delete;
  Hash128Stream& operator=(const Hash128Stream&) = delete;
  void Update(std::span<const std::byte> bytes);
  Hash128Value Digest() const;

 private:
  void* state_;  // XXH3_state_t
};

}  // namespace skippy
