#include "skippy/runtime/synthetic_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "skippy/common/strings.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "skippy/common/digest.h"
#include "skippy/runtime/llama_backend.h"

#ifndef SKIPPY_LLAMA_COMMIT
#define SKIPPY_LLAMA_COMMIT "unknown"
#endif

namespace skippy::runtime {
namespace {

struct GgufDeleter {
  void operator()(gguf_context* ctx) const { gguf_free(ctx); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;
struct GgmlDeleter {
  void operator()(ggml_context* ctx) const { ggml_free(ctx); }
};
using GgmlPtr = std::unique_ptr<ggml_context, GgmlDeleter>;

std::string VocabPath(const std::string& vocab_dir, const zoo::FamilySpec& family) {
  return StrCat(vocab_dir, "/ggml-vocab-", family.vocab, ".gguf");
}

void SetMeta(gguf_context* ctx, const zoo::MetaEntry& e) {
  const char* k = e.key.c_str();
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, uint32_t>) gguf_set_val_u32(ctx, k, v);
        else if constexpr (std::is_same_v<T, int32_t>) gguf_set_val_i32(ctx, k, v);
        else if constexpr (std::is_same_v<T, float>) gguf_set_val_f32(ctx, k, v);
        else if constexpr (std::is_same_v<T, bool>) gguf_set_val_bool(ctx, k, v);
        else if constexpr (std::is_same_v<T, std::string>) gguf_set_val_str(ctx, k, v.c_str());
        else gguf_set_arr_data(ctx, k, GGUF_TYPE_UINT32, v.data(), v.size());
      },
      e.value);
}

// Copies only the tokenizer.* keys of `vocab` into `dst` (after dst's own keys).
void CopyTokenizerKeys(gguf_context* dst, const gguf_context* vocab) {
  GgufPtr tmp(gguf_init_empty());
  gguf_set_kv(tmp.get(), vocab);
  for (int64_t i = gguf_get_n_kv(tmp.get()) - 1; i >= 0; --i) {
    std::string key = gguf_get_key(tmp.get(), i);
    if (!absl::StartsWith(key, "tokenizer.")) gguf_remove_key(tmp.get(), key.c_str());
  }
  gguf_set_kv(dst, tmp.get());
}

StatusOr<GgufPtr> LoadVocab(const std::string& path) {
  gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/nullptr};
  GgufPtr vocab(gguf_init_from_file(path.c_str(), params));
  if (!vocab) return absl::NotFoundError(StrCat("cannot read tokenizer file ", path));
  return vocab;
}

StatusOr<GgufPtr> BuildContext(const zoo::FamilySpec& family, zoo::Preset preset, const std::string& vocab_dir,
                               uint32_t* n_vocab) {
  SKIPPY_ASSIGN_OR_RETURN(zoo::Metadata meta, zoo::BuildMetadata(family, preset));
  SKIPPY_ASSIGN_OR_RETURN(GgufPtr vocab, LoadVocab(VocabPath(vocab_dir, family)));
  GgufPtr ctx(gguf_init_empty());
  for (const zoo::MetaEntry& e : meta) SetMeta(ctx.get(), e);
  gguf_set_val_str(ctx.get(), "skippy.zoo.llama_cpp_commit", SKIPPY_LLAMA_COMMIT);
  CopyTokenizerKeys(ctx.get(), vocab.get());
  const int64_t tok = gguf_find_key(ctx.get(), "tokenizer.ggml.tokens");
  if (tok < 0) return absl::DataLossError(StrCat("tokenizer file for ", family.key, " has no token list"));
  *n_vocab = static_cast<uint32_t>(gguf_get_arr_n(ctx.get(), tok));
  return ctx;
}

struct TensorShape {
  std::string name;
  int n_dims = 0;
  int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
};

void RecordTensor(ggml_tensor* t, void* ud) {
  auto* out = static_cast<std::vector<TensorShape>*>(ud);
  TensorShape s;
  s.name = ggml_get_name(t);
  s.n_dims = ggml_n_dims(t);
  for (int i = 0; i < GGML_MAX_DIMS; ++i) s.ne[i] = t->ne[i];
  out->push_back(std::move(s));
}

// Asks llama.cpp which tensors the architecture needs for this metadata.
StatusOr<std::vector<TensorShape>> DiscoverTensors(gguf_context* ctx, const zoo::FamilySpec& family) {
  EnsureLlamaBackend();
  std::vector<TensorShape> shapes;
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_init_from_user(ctx, RecordTensor, &shapes, mp);
  if (model == nullptr) {
    return absl::InvalidArgumentError(StrCat("llama.cpp rejected the metadata of family ", family.key, ": ",
                                                   TakeLlamaLogTail()));
  }
  llama_model_free(model);
  // Tied or duplicated tensors are reported once per use; keep the first.
  std::set<std::string> seen;
  std::vector<TensorShape> unique;
  for (TensorShape& s : shapes) {
    if (seen.insert(s.name).second) unique.push_back(std::move(s));
  }
  return unique;
}

// The loader accepts some tensors in two layouts and builds its graph from one. Qwen3Next's gated
// delta-net input projection is the fused pair attn_qkv + attn_gate (read whenever present) or the
// legacy ssm_in, which is then never read: writing both leaves a dead tensor, which llama-imatrix
// never sees, so llama-quantize refuses the IQ1/IQ2 formats for the model. Keep the layout the
// graph reads, as a converted GGUF does.
void DropUnreadAlternatives(std::vector<TensorShape>& shapes) {
  std::set<std::string> names;
  for (const TensorShape& s : shapes) names.insert(s.name);
  std::erase_if(shapes, [&](const TensorShape& s) {
    const size_t at = s.name.find(".ssm_in.");
    return s.name.starts_with("blk.") && at != std::string::npos &&
           names.contains(s.name.substr(0, at) + ".attn_qkv.weight");
  });
}

// --- deterministic weights ---------------------------------------------------------------------

struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
};

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

enum class Init { kNormal, kOnesNoisy, kConstant, kUniform };
struct InitRule {
  Init kind = Init::kNormal;
  float a = 0.0f;  // std (normal), constant, or low bound (uniform)
  float b = 0.0f;  // high bound (uniform)
};

InitRule RuleFor(const TensorShape& s) {
  const std::string& n = s.name;
  const int64_t ne = s.ne[0] * s.ne[1] * s.ne[2] * s.ne[3];
  if (absl::StrContains(n, "ssm_a")) return {Init::kUniform, -1.5f, -0.5f};        // decay must be negative
  if (absl::StrContains(n, "ssm_d")) {
    if (absl::StrContains(n, "ssm_dt")) {
      if (absl::EndsWith(n, ".bias")) return {Init::kUniform, -4.5f, -2.5f};       // softplus^-1 of a small dt
    } else {
      return {Init::kConstant, 1.0f};                                              // skip connection D
    }
  }
  if (absl::StrContains(n, "rope_freqs")) return {Init::kConstant, 1.0f};
  if (absl::StrContains(n, "exp_probs_b")) return {Init::kConstant, 0.0f};
  if (absl::StrContains(n, "norm") && !absl::EndsWith(n, ".bias")) return {Init::kOnesNoisy, 0.02f};
  if (ne == 1 || absl::EndsWith(n, ".scale")) return {Init::kConstant, 1.0f};
  if (absl::EndsWith(n, ".bias")) return {Init::kNormal, 0.02f};
  if (s.n_dims <= 1) return {Init::kNormal, 0.02f};
  return {Init::kNormal, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.ne[0])))};
}

ggml_type TypeFor(const TensorShape& s) {
  if (s.n_dims <= 1) return GGML_TYPE_F32;
  // Small parameter tensors the graphs read as F32 in converted models.
  if (absl::StrContains(s.name, "ssm_") && !absl::StrContains(s.name, "ssm_in") &&
      !absl::StrContains(s.name, "ssm_out")) {
    return GGML_TYPE_F32;
  }
  if (absl::StrContains(s.name, "norm") || absl::StrContains(s.name, "ffn_gate_inp")) return GGML_TYPE_F32;
  return GGML_TYPE_F16;
}

void Fill(const TensorShape& s, uint64_t seed, std::vector<float>& out) {
  const int64_t ne = s.ne[0] * s.ne[1] * s.ne[2] * s.ne[3];
  out.resize(static_cast<size_t>(ne));
  SplitMix64 rng{seed ^ Fnv1a(s.name)};
  const InitRule r = RuleFor(s);
  for (int64_t i = 0; i < ne; ++i) {
    switch (r.kind) {
      case Init::kConstant: out[i] = r.a; break;
      case Init::kUniform: out[i] = static_cast<float>(r.a + (r.b - r.a) * rng.Uniform()); break;
      case Init::kNormal:
      case Init::kOnesNoisy: {
        // Box-Muller, one value per pair of uniforms (simple and portable; std:: distributions are
        // implementation-defined and would break byte-identity across standard libraries).
        const double u1 = 1.0 - rng.Uniform();
        const double u2 = rng.Uniform();
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        out[i] = static_cast<float>((r.kind == Init::kOnesNoisy ? 1.0 : 0.0) + r.a * z);
        break;
      }
    }
  }
}

}  // namespace

StatusOr<std::string> SyntheticSpecDigest(const zoo::FamilySpec& family, zoo::Preset preset,
                                          const std::string& vocab_dir) {
  SKIPPY_ASSIGN_OR_RETURN(zoo::Metadata meta, zoo::BuildMetadata(family, preset));
  std::string text = StrCat("generator=", zoo::kGeneratorVersion, "\nllama=", SKIPPY_LLAMA_COMMIT,
                                  "\nseed=", family.seed, "\n");
  for (const zoo::MetaEntry& e : meta) {
    StrAppend(&text, e.key, "=");
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::vector<uint32_t>>) {
            for (uint32_t x : v) StrAppend(&text, x, ",");
          } else if constexpr (std::is_same_v<T, float>) {
            uint32_t bits;
            std::memcpy(&bits, &v, sizeof bits);
            StrAppend(&text, bits);
          } else {
            StrAppend(&text, v);
          }
        },
        e.value);
    text += "\n";
  }
  SKIPPY_ASSIGN_OR_RETURN(Sha256Digest vocab, Sha256File(VocabPath(vocab_dir, family)));
  StrAppend(&text, "vocab=", ToHex(vocab), "\n");
  return ToHex(Sha256(text));
}

StatusOr<SyntheticModelInfo> WriteSyntheticModel(const zoo::FamilySpec& family, zoo::Preset preset,
                                                 const std::string& vocab_dir, const std::string& out_path) {
  uint32_t n_vocab = 0;
  SKIPPY_ASSIGN_OR_RETURN(GgufPtr ctx, BuildContext(family, preset, vocab_dir, &n_vocab));
  SKIPPY_ASSIGN_OR_RETURN(std::vector<TensorShape> shapes, DiscoverTensors(ctx.get(), family));
  DropUnreadAlternatives(shapes);
  SKIPPY_ASSIGN_OR_RETURN(std::string digest, SyntheticSpecDigest(family, preset, vocab_dir));
  gguf_set_val_str(ctx.get(), "skippy.zoo.spec_digest", digest.c_str());

  // Tensor descriptors live in a no-alloc ggml context; gguf_add_tensor copies what it needs.
  ggml_init_params gp = {/*mem_size=*/ggml_tensor_overhead() * (shapes.size() + 1), /*mem_buffer=*/nullptr,
                         /*no_alloc=*/true};
  GgmlPtr gctx(ggml_init(gp));
  uint64_t n_params = 0;
  std::vector<ggml_type> types;
  for (const TensorShape& s : shapes) {
    const ggml_type type = TypeFor(s);
    ggml_tensor* t = ggml_new_tensor(gctx.get(), type, s.n_dims, s.ne);
    ggml_set_name(t, s.name.c_str());
    gguf_add_tensor(ctx.get(), t);
    types.push_back(type);
    n_params += static_cast<uint64_t>(ggml_nelements(t));
  }

  const std::string tmp_path = out_path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp_path.c_str(), "wb"), &std::fclose);
  if (!f) return absl::InternalError(StrCat("cannot write ", tmp_path));
  std::vector<uint8_t> meta_bytes(gguf_get_meta_size(ctx.get()));
  gguf_get_meta_data(ctx.get(), meta_bytes.data());
  bool ok = std::fwrite(meta_bytes.data(), 1, meta_bytes.size(), f.get()) == meta_bytes.size();

  const size_t align = gguf_get_alignment(ctx.get());
  std::vector<float> values;
  std::vector<ggml_fp16_t> halfs;
  static const uint8_t kZeros[64] = {};
  for (size_t i = 0; ok && i < shapes.size(); ++i) {
    Fill(shapes[i], family.seed, values);
    size_t nbytes;
    if (types[i] == GGML_TYPE_F16) {
      halfs.resize(values.size());
      ggml_fp32_to_fp16_row(values.data(), halfs.data(), static_cast<int64_t>(values.size()));
      nbytes = halfs.size() * sizeof(ggml_fp16_t);
      ok = std::fwrite(halfs.data(), 1, nbytes, f.get()) == nbytes;
    } else {
      nbytes = values.size() * sizeof(float);
      ok = std::fwrite(values.data(), 1, nbytes, f.get()) == nbytes;
    }
    const size_t pad = GGML_PAD(nbytes, align) - nbytes;
    if (ok && pad) ok = std::fwrite(kZeros, 1, pad, f.get()) == pad;
  }
  ok = ok && std::fflush(f.get()) == 0;
  f.reset();
  if (!ok) {
    std::filesystem::remove(tmp_path);
    return absl::InternalError(StrCat("write failed for ", tmp_path));
  }
  std::error_code ec;
  std::filesystem::rename(tmp_path, out_path, ec);
  if (ec) return absl::InternalError(StrCat("cannot rename ", tmp_path, ": ", ec.message()));

  SyntheticModelInfo info;
  info.path = out_path;
  info.n_params = n_params;
  info.file_bytes = std::filesystem::file_size(out_path);
  info.n_vocab = n_vocab;
  info.n_tensors = static_cast<uint32_t>(shapes.size());
  info.spec_digest = digest;
  return info;
}

}  // namespace skippy::runtime
