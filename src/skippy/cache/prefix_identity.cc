#include "skippy/cache/prefix_identity.h"

#include <cstring>
#include <string>

namespace skippy::cache {
namespace {

// Encoding version: bump when a field is added so fingerprints of old scopes never alias new ones.
constexpr uint32_t kEncodingVersion = 1;

void PutU32(std::string& out, uint32_t v) {
  char buf[4];
  std::memcpy(buf, &v, 4);
  out.append(buf, 4);
}
void PutI32(std::string& out, int32_t v) { PutU32(out, static_cast<uint32_t>(v)); }
void PutBool(std::string& out, bool v) { out.push_back(v ? 1 : 0); }
void PutString(std::string& out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

}  // namespace

Status CacheConfigIdentity::Validate() const {
  if (model_id.empty()) return absl::InvalidArgumentError("cache identity: model_id is empty");
  if (layer_begin < 0 || layer_end <= layer_begin) {
    return absl::InvalidArgumentError("cache identity: empty layer range [" +
                                      std::to_string(layer_begin) + ", " +
                                      std::to_string(layer_end) + ")");
  }
  if (n_vocab <= 0) return absl::InvalidArgumentError("cache identity: n_vocab must be > 0");
  if (n_ctx == 0) return absl::InvalidArgumentError("cache identity: n_ctx must be > 0");
  if (token_start < 0) return absl::InvalidArgumentError("cache identity: token_start < 0");
  return absl::OkStatus();
}

std::string PrefixScope::CanonicalEncoding() const {
  const CacheConfigIdentity& c = config;
  std::string out;
  out.reserve(128 + c.model_id.size() + c.position_config.size() + cache_namespace.size());
  out.append("skippy-scope");
  PutU32(out, kEncodingVersion);
  PutString(out, c.model_id);
  PutI32(out, c.layer_begin);
  PutI32(out, c.layer_end);
  PutString(out, c.runtime_abi);
  PutString(out, c.llama_version);
  PutString(out, c.type_k);
  PutString(out, c.type_v);
  PutBool(out, c.flash_attn);
  PutBool(out, c.v_trans);
  PutBool(out, c.kv_unified);
  PutBool(out, c.swa_full);
  PutU32(out, c.n_ctx);
  PutString(out, c.position_config);
  PutI32(out, c.n_vocab);
  PutI32(out, c.token_start);
  PutString(out, cache_namespace);
  return out;
}

uint64_t PrefixScope::Fingerprint() const {
  std::string enc = CanonicalEncoding();
  return Hash64(std::as_bytes(std::span(enc.data(), enc.size())));
}

Sha256Digest PrefixScope::Digest() const { return Sha256(CanonicalEncoding()); }

Status ValidateTokens(const CacheConfigIdentity& config, std::span<const Token> tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("empty prompt: no tokens to look up or record");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config.n_vocab) {
      return absl::InvalidArgumentError("token id " + std::to_string(tokens[i]) + " at position " +
                                        std::to_string(i) + " is outside the vocabulary [0, " +
                                        std::to_string(config.n_vocab) + ")");
    }
  }
  return absl::OkStatus();
}

uint64_t HashTokens(std::span<const Token> tokens, uint64_t seed) {
  return Hash64(std::as_bytes(tokens), seed);
}

}  // namespace skippy::cache
