// The byte encoding of a prefix entry's head, shared by the tiers keyed by prefix (DiskTier,
// SharedTier): the configuration identity, the PrefixRecord, the payload's size and XXH3-128 and,
// for a tier that stores payloads as blocks, each block's size and XXH3-128.
//
// Encoding, all integers little-endian (the host's; a big-endian host finds every head foreign,
// because the identity encoding does not match):
//   magic (8 bytes) | u32 version | u32 body_len | body | u64 XXH3-64 of all before
// body: str identity | str namespace | u8 kind | u8 exact_only | u64 n_tokens | i32 tokens[]
//       | u64 min_long | u32 n_runs | (u64 begin, u64 end, u8 short)[] | u64 payload_len
//       | u64 payload_xxh3_128.low | u64 .high
//       [with blocks: u32 n_blocks | (u64 len, u64 xxh3_128.low, u64 .high)[]]
// str: u32 length, then the bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "skippy/cache/prefix_tier.h"
#include "skippy/common/digest.h"
#include "skippy/common/status.h"

namespace skippy::cache {

struct PayloadBlock {
  uint64_t len = 0;
  Hash128Value hash;
};

struct EntryHead {
  std::string identity;  // PrefixScope{identity, ""}.CanonicalEncoding()
  PrefixRecord record;
  uint64_t payload_len = 0;
  Hash128Value payload_hash;
  std::vector<PayloadBlock> blocks;  // only in heads encoded with_blocks
};

struct EntryFormat {
  std::string_view magic;  // exactly 8 bytes
  uint32_t version = 1;
  bool with_blocks = false;
};

// Bytes before the body: magic, version and body length.
inline constexpr size_t kEntryPrefixBytes = 8 + 4 + 4;
// The head's own checksum after the body.
inline constexpr size_t kEntryHashBytes = 8;

std::string EncodeEntryHead(const EntryFormat& format, const EntryHead& head);
// The body's length from the first kEntryPrefixBytes; DataLoss when they are not this format's.
StatusOr<uint32_t> ParseEntryPrefix(const EntryFormat& format, std::string_view prefix);
// A whole head (prefix, body, checksum); DataLoss for anything that does not verify or parse.
StatusOr<EntryHead> ParseEntryHead(const EntryFormat& format, std::string_view head);

// The content key of an entry: XXH3-128 of the identity, namespace, kind and tokens. The same
// prefix of the same configuration always gets the same key, in every process.
Hash128Value EntryKey(std::string_view identity, const PrefixRecord& record);
// 32 lowercase hex digits, high half first.
std::string HexOf(const Hash128Value& h);

}  // namespace skippy::cache
