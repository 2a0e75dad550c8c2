// Prefix identity: everything that must be equal for a cached prefix to be valid for a request.
//
// A cached prefix is valid for a request only when the model, the layer range, the runtime ABI and
// llama.cpp version, the KV layout and dtypes, the context/position configuration, the tenant
// namespace (cache salt), the token start and the exact token ids all match
// (docs/DESIGN.md, "Payloads and prefix identity"). This header holds the non-token part; the radix index
// holds the tokens.
//
// Hashing. PrefixScope::Fingerprint() is XXH3-64 over a canonical, length-prefixed encoding. It is
// chosen for speed (it runs on every lookup) and is only ever used to *index*: every hit is
// confirmed by comparing all fields with operator== and the stored tokens element by element, so a
// collision -- accidental or engineered by a client who controls prompts and salts -- can never
// return another prefix's state; at worst it costs a comparison. Where a digest leaves the process
// (reports, tenant-visible keys) use Digest(), which is SHA-256 over the same encoding.
//
// Thread-safety: plain values; const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "skippy/cache/payload_kind.h"
#include "skippy/common/digest.h"
#include "skippy/common/status.h"

namespace skippy::cache {

// The runtime configuration a stored prefix was computed under. Filled once by the runtime
// adapter from the loaded model and context; the cache core treats the strings as opaque.
struct CacheConfigIdentity {
  std::string model_id;        // model file SHA-256 (hex) or a model id that pins the weights
  int32_t layer_begin = 0;     // first layer held (inclusive)
  int32_t layer_end = 0;       // one past the last layer held; layer_end > layer_begin
  std::string runtime_abi;     // Skippy runtime adapter ABI tag
  std::string llama_version;   // llama.cpp version / commit the state was produced by
  std::string type_k = "f16";  // ggml type name of the K cache
  std::string type_v = "f16";  // ggml type name of the V cache
  bool flash_attn = false;
  bool v_trans = true;         // V stored transposed (true when flash attention is off)
  bool kv_unified = false;
  bool swa_full = false;
  uint32_t n_ctx = 0;          // context size (positions available)
  std::string position_config; // rope type / scaling / n_ubatch ... anything else that changes bits
  int32_t n_vocab = 0;         // vocabulary size; token ids must lie in [0, n_vocab)
  int32_t token_start = 0;     // position of the first token of every stored prefix

  friend bool operator==(const CacheConfigIdentity&, const CacheConfigIdentity&) = default;

  // OK, or InvalidArgument naming the first bad field (empty model id, empty layer range,
  // n_vocab <= 0, n_ctx == 0, negative token start).
  [[nodiscard]] Status Validate() const;
};

// The scope a radix tree lives in: configuration plus tenant namespace (cache salt). Two requests
// share cached state only if their scopes are equal.
struct PrefixScope {
  CacheConfigIdentity config;
  std::string cache_namespace;  // tenant namespace / cache salt; "" is the default namespace

  friend bool operator==(const PrefixScope&, const PrefixScope&) = default;

  // Canonical, versioned, length-prefixed byte encoding of every field.
  std::string CanonicalEncoding() const;
  // XXH3-64 of CanonicalEncoding(): an index key, never a proof of identity (see above).
  uint64_t Fingerprint() const;
  // SHA-256 of CanonicalEncoding(): for reports and anything shown outside the process.
  Sha256Digest Digest() const;
  // OK, or InvalidArgument: see CacheConfigIdentity::Validate.
  [[nodiscard]] Status Validate() const { return config.Validate(); }
};

// Checks a prompt against the scope's vocabulary: InvalidArgument for an empty prompt or a token
// id outside [0, n_vocab) (the message names the first bad position and id).
[[nodiscard]] Status ValidateTokens(const CacheConfigIdentity& config,
                                    std::span<const Token> tokens);

// XXH3-64 of the token ids (native byte order), seeded. Index only; confirm by comparing tokens.
uint64_t HashTokens(std::span<const Token> tokens, uint64_t seed = 0);

}  // namespace skippy::cache
