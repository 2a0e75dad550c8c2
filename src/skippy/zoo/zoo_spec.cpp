#include "skippy/zoo/zoo_spec.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <iterator>
#include <string>

#include "skippy/common/strings.h"


namespace skippy::zoo {
namespace {

std::string K(std::string_view arch, std::string_view suffix) { return StrCat(arch, ".", suffix); }

void Add(Metadata& out, std::string key, MetaValue value) { out.push_back({std::move(key), std::move(value)}); }

// Keys every decoder family reads.
void AddAttentionCore(const Dims& d, std::string_view arch, Metadata& out) {
  Add(out, K(arch, "context_length"), d.n_ctx_train);
  Add(out, K(arch, "embedding_length"), d.n_embd);
  Add(out, K(arch, "block_count"), d.n_layer);
  if (d.n_ff) Add(out, K(arch, "feed_forward_length"), d.n_ff);
  Add(out, K(arch, "attention.head_count"), d.n_head);
  Add(out, K(arch, "attention.head_count_kv"), d.n_head_kv);
  if (d.head_dim) {
    Add(out, K(arch, "attention.key_length"), d.head_dim);
    Add(out, K(arch, "attention.value_length"), d.head_dim);
  }
}

void AddMoe(const Dims& d, std::string_view arch, Metadata& out) {
  Add(out, K(arch, "expert_count"), d.n_expert);
  Add(out, K(arch, "expert_used_count"), d.n_expert_used);
  Add(out, K(arch, "expert_feed_forward_length"), d.n_ff_exp);
}

void AddSsm(const Dims& d, std::string_view arch, Metadata& out) {
  Add(out, K(arch, "ssm.conv_kernel"), uint32_t{4});
  Add(out, K(arch, "ssm.inner_size"), d.ssm_d_inner);
  Add(out, K(arch, "ssm.state_size"), d.ssm_d_state);
  Add(out, K(arch, "ssm.time_step_rank"), d.ssm_dt_rank);
  Add(out, K(arch, "ssm.group_count"), d.ssm_n_group);
}

std::vector<uint32_t> SwaLayers(const Dims& d) {
  // 1 = sliding-window layer; every swa_period-th layer is global (Gemma's pattern).
  std::vector<uint32_t> v(d.n_layer);
  for (uint32_t il = 0; il < d.n_layer; ++il) v[il] = ((il + 1) % d.swa_period) != 0 ? 1u : 0u;
  return v;
}

void LlamaMeta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  Add(out, K(arch, "rope.dimension_count"), d.head_dim);
  Add(out, K(arch, "rope.freq_base"), 500000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-5f);
}

void Qwen3Meta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  Add(out, K(arch, "rope.freq_base"), 1000000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-6f);
}

void Qwen3NextMeta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  AddMoe(d, arch, out);
  Add(out, K(arch, "expert_shared_feed_forward_length"), d.n_ff_exp);
  AddSsm(d, arch, out);
  Add(out, K(arch, "full_attention_interval"), uint32_t{4});
  Add(out, K(arch, "rope.dimension_count"), d.rope_dim);  // partial rotary (0.25 of the head)
  Add(out, K(arch, "rope.freq_base"), 10000000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-6f);
}

void FalconH1Meta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  AddSsm(d, arch, out);
  Add(out, K(arch, "rope.dimension_count"), d.head_dim);
  Add(out, K(arch, "rope.freq_base"), 100000000000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-5f);
}

void DeepSeek2Meta(const Dims& d, std::string_view arch, Metadata& out, uint32_t gating_func,
                   bool weights_norm, float weights_scale, uint32_t expert_groups, uint32_t groups_used) {
  Add(out, K(arch, "context_length"), d.n_ctx_train);
  Add(out, K(arch, "embedding_length"), d.n_embd);
  Add(out, K(arch, "block_count"), d.n_layer);
  Add(out, K(arch, "feed_forward_length"), d.n_ff);
  Add(out, K(arch, "attention.head_count"), d.n_head);
  // MLA: the cache holds one latent "head": kv_lora_rank plus the rope part for K, kv_lora for V.
  Add(out, K(arch, "attention.head_count_kv"), uint32_t{1});
  Add(out, K(arch, "attention.key_length"), d.kv_lora_rank + d.rope_dim);
  Add(out, K(arch, "attention.value_length"), d.kv_lora_rank);
  Add(out, K(arch, "attention.key_length_mla"), d.qk_nope_dim + d.rope_dim);
  Add(out, K(arch, "attention.value_length_mla"), d.v_head_dim);
  Add(out, K(arch, "attention.q_lora_rank"), d.q_lora_rank);
  Add(out, K(arch, "attention.kv_lora_rank"), d.kv_lora_rank);
  Add(out, K(arch, "rope.dimension_count"), d.rope_dim);
  Add(out, K(arch, "rope.freq_base"), 10000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-6f);
  Add(out, K(arch, "leading_dense_block_count"), d.n_dense_lead);
  AddMoe(d, arch, out);
  Add(out, K(arch, "expert_shared_count"), d.n_expert_shared);
  Add(out, K(arch, "expert_weights_scale"), weights_scale);
  Add(out, K(arch, "expert_weights_norm"), weights_norm);
  Add(out, K(arch, "expert_gating_func"), gating_func);
  if (expert_groups) {
    Add(out, K(arch, "expert_group_count"), expert_groups);
    Add(out, K(arch, "expert_group_used_count"), groups_used);
  }
}
// llama.cpp's llama_expert_gating_func_type: 1 = softmax, 2 = sigmoid.
void DeepSeek2LiteMeta(const Dims& d, std::string_view a, Metadata& o) { DeepSeek2Meta(d, a, o, 1, false, 1.0f, 0, 0); }
void Glm47FlashMeta(const Dims& d, std::string_view a, Metadata& o) { DeepSeek2Meta(d, a, o, 2, true, 1.8f, 0, 0); }
void DeepSeek3Meta(const Dims& d, std::string_view a, Metadata& o) { DeepSeek2Meta(d, a, o, 2, true, 2.5f, 2, 1); }

void Glm4Meta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  Add(out, K(arch, "rope.dimension_count"), d.head_dim / 2);  // partial rotary
  Add(out, K(arch, "rope.freq_base"), 10000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-5f);
}

void Gemma4Meta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  if (d.n_expert) AddMoe(d, arch, out);
  Add(out, K(arch, "attention.sliding_window"), d.n_swa);
  Add(out, K(arch, "attention.sliding_window_pattern"), SwaLayers(d));
  Add(out, K(arch, "attention.key_length_swa"), d.head_dim_swa);
  Add(out, K(arch, "attention.value_length_swa"), d.head_dim_swa);
  Add(out, K(arch, "attention.shared_kv_layers"), uint32_t{0});
  Add(out, K(arch, "embedding_length_per_layer_input"), d.n_embd_per_layer);
  Add(out, K(arch, "rope.dimension_count"), d.head_dim);
  Add(out, K(arch, "rope.dimension_count_swa"), d.head_dim_swa);
  Add(out, K(arch, "rope.freq_base"), 1000000.0f);
  Add(out, K(arch, "rope.freq_base_swa"), 10000.0f);
  Add(out, K(arch, "final_logit_softcapping"), 30.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-6f);
}

void Gemma3Meta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  Add(out, K(arch, "attention.sliding_window"), d.n_swa);
  Add(out, K(arch, "attention.sliding_window_pattern"), d.swa_period);
  Add(out, K(arch, "rope.freq_base"), 1000000.0f);
  Add(out, K(arch, "rope.freq_base_swa"), 10000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-6f);
}

void Gemma2Meta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  Add(out, K(arch, "attention.sliding_window"), d.n_swa);
  Add(out, K(arch, "attention.sliding_window_pattern"), d.swa_period);
  Add(out, K(arch, "attn_logit_softcapping"), 50.0f);
  Add(out, K(arch, "final_logit_softcapping"), 30.0f);
  Add(out, K(arch, "rope.freq_base"), 10000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-6f);
}

void OlmoMeta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  Add(out, K(arch, "rope.freq_base"), 10000.0f);
  Add(out, K(arch, "attention.layer_norm_epsilon"), 1e-5f);
}

void MiniMaxM2Meta(const Dims& d, std::string_view arch, Metadata& out) {
  AddAttentionCore(d, arch, out);
  AddMoe(d, arch, out);
  Add(out, K(arch, "expert_gating_func"), uint32_t{2});
  Add(out, K(arch, "rope.dimension_count"), d.rope_dim);  // partial rotary
  Add(out, K(arch, "rope.freq_base"), 5000000.0f);
  Add(out, K(arch, "attention.layer_norm_rms_epsilon"), 1e-6f);
}

// ---- Dims helpers: the numbers of each preset, kept next to each other for review. ----------

constexpr Dims Dense(uint32_t embd, uint32_t layers, uint32_t heads, uint32_t kv, uint32_t hd, uint32_t ff,
                     uint32_t ctx = 4096) {
  Dims d;
  d.n_embd = embd; d.n_layer = layers; d.n_head = heads; d.n_head_kv = kv; d.head_dim = hd; d.n_ff = ff;
  d.n_ctx_train = ctx;
  return d;
}
constexpr Dims WithMoe(Dims d, uint32_t experts, uint32_t used, uint32_t ff_exp, uint32_t shared = 0) {
  d.n_expert = experts; d.n_expert_used = used; d.n_ff_exp = ff_exp; d.n_expert_shared = shared;
  return d;
}
constexpr Dims WithSsm(Dims d, uint32_t state, uint32_t groups, uint32_t heads, uint32_t inner) {
  d.ssm_d_state = state; d.ssm_n_group = groups; d.ssm_dt_rank = heads; d.ssm_d_inner = inner;
  return d;
}
constexpr Dims WithSwa(Dims d, uint32_t window, uint32_t period, uint32_t hd_swa = 0) {
  d.n_swa = window; d.swa_period = period; d.head_dim_swa = hd_swa;
  return d;
}
constexpr Dims WithRope(Dims d, uint32_t rope_dim) { d.rope_dim = rope_dim; return d; }
constexpr Dims Mla(uint32_t embd, uint32_t layers, uint32_t heads, uint32_t ff, uint32_t q_lora, uint32_t kv_lora,
                   uint32_t rope, uint32_t nope, uint32_t v_head, uint32_t dense_lead) {
  Dims d = Dense(embd, layers, heads, 1, 0, ff);
  d.q_lora_rank = q_lora; d.kv_lora_rank = kv_lora; d.rope_dim = rope; d.qk_nope_dim = nope;
  d.v_head_dim = v_head; d.n_dense_lead = dense_lead;
  return d;
}
constexpr Dims WithPle(Dims d, uint32_t per_layer) { d.n_embd_per_layer = per_layer; return d; }

constexpr std::string_view kQwenVocabNote = "";
constexpr std::string_view kGemmaStandIn =
    "stand-in: the Gemma 4 tokenizer (262k SentencePiece-style BPE), the closest Gemma tokenizer the pinned tree ships";
constexpr std::string_view kGlmStandIn =
    "stand-in: Qwen2 BPE (151k), close in size and style to GLM's 151k BPE; the tree ships no GLM vocab";

const std::array<FamilySpec, 14> kFamilies = {{
    {"qwen3next", "MoE, hybrid gated delta-net + attention (every 4th layer)", "bartowski/Qwen_Qwen3-Coder-Next-GGUF:IQ2_XS", "qwen2",
     kQwenVocabNote, 0x51e3e7,
     WithRope(WithSsm(WithMoe(Dense(64, 4, 2, 1, 32, 128), 4, 2, 64), 16, 2, 4, 64), 8),
     WithRope(WithSsm(WithMoe(Dense(768, 8, 8, 2, 128, 1024), 16, 4, 384), 64, 4, 8, 512), 32),
     std::nullopt, "", "IQ2_XS", WithRope(WithSsm(WithMoe(Dense(256, 4, 4, 1, 64, 512), 4, 2, 256), 64, 2, 4, 256), 16),
     &Qwen3NextMeta},
    {"falcon-h1", "attention + Mamba2 in parallel on every layer", "tiiuae/Falcon-H1-1.5B-Instruct-GGUF:Q4_K_M", "falcon",
     "stand-in: the Falcon (original) BPE; Falcon-H1's own tokenizer is not in the tree", 0xfa1c0,
     WithSsm(Dense(64, 2, 4, 2, 16, 128), 16, 1, 4, 128),
     WithSsm(Dense(768, 8, 8, 2, 64, 2048), 64, 1, 12, 1536),
     WithSsm(Dense(2048, 24, 8, 2, 128, 4096, 16384), 256, 1, 24, 3072),
     "approximately Falcon-H1-1.5B (from its published config as we recall it; verify before citing)",
     "Q4_K_M", std::nullopt,
     &FalconH1Meta},
    {"llama", "dense GQA", "hugging-quants/Llama-3.2-1B-Instruct-Q4_K_M-GGUF:Q4_K_M", "llama-bpe",
     "", 0x11a3a,
     Dense(64, 2, 4, 2, 16, 128), Dense(1024, 8, 16, 4, 64, 2816),
     Dense(2048, 16, 32, 8, 64, 8192, 131072), "Llama 3.2 1B (no rope scaling tensor)", "Q4_K_M", Dense(256, 2, 4, 2, 64, 512),
     &LlamaMeta},
    {"qwen3", "dense GQA with q/k norm", "Qwen/Qwen3-0.6B:Q8_0", "qwen2",
     "", 0x9e3,
     Dense(64, 2, 4, 2, 16, 128), Dense(768, 8, 8, 4, 128, 2048),
     Dense(1024, 28, 16, 8, 128, 3072, 40960), "Qwen3 0.6B", "Q8_0", std::nullopt,
     &Qwen3Meta},
    {"deepseek2", "MLA + MoE with shared expert, first layer dense", "bartowski/DeepSeek-Coder-V2-Lite-Instruct-GGUF:Q4_K_M", "deepseek-llm",
     "", 0xdee2,
     WithMoe(Mla(64, 3, 4, 128, 32, 32, 16, 16, 16, 1), 4, 2, 64, 1),
     WithMoe(Mla(768, 8, 8, 2048, 256, 256, 32, 64, 64, 1), 16, 4, 384, 1),
     std::nullopt, "", "Q4_K_M", WithMoe(Mla(256, 3, 4, 512, 256, 256, 32, 32, 64, 1), 4, 2, 256, 1),
     &DeepSeek2LiteMeta},
    {"glm47-flash", "MLA + MoE (sigmoid routing), GLM tokenizer", "unsloth/GLM-4.7-Flash-GGUF:Q4_K_M", "qwen2",
     kGlmStandIn, 0x61a47,
     WithMoe(Mla(64, 3, 4, 128, 32, 32, 16, 16, 16, 1), 4, 2, 64, 1),
     WithMoe(Mla(768, 8, 8, 2048, 256, 256, 32, 64, 64, 1), 16, 4, 384, 1),
     std::nullopt, "", "Q4_K_M", std::nullopt,
     &Glm47FlashMeta},
    {"glm4", "dense GQA, partial rotary, post norms", "meshllm/glm-4-9b-0414-parity-q4_k_m-gguf:Q4_K_M", "qwen2",
     kGlmStandIn, 0x6104,
     Dense(64, 2, 4, 2, 16, 128), Dense(1024, 8, 8, 2, 128, 2816), std::nullopt, "", "Q4_K_M", std::nullopt,
     &Glm4Meta},
    {"gemma4-a4b", "MoE, SWA (5 local : 1 global)", "batiai/Gemma-4-26B-A4B-it-GGUF:Q6_K", "gemma-4",
     "", 0x6e4a4b,
     WithMoe(WithSwa(Dense(64, 6, 2, 1, 32, 128), 32, 6, 16), 4, 2, 64),
     WithMoe(WithSwa(Dense(768, 6, 8, 2, 128, 1024), 64, 6, 64), 16, 4, 384),
     std::nullopt, "", "Q6_K", std::nullopt,
     &Gemma4Meta},
    {"gemma4-e4b", "dense, per-layer embeddings, SWA (5 local : 1 global)", "unsloth/gemma-4-E4B-it-GGUF:Q4_K_M", "gemma-4",
     "", 0x6e4e4b,
     WithPle(WithSwa(Dense(64, 6, 2, 1, 32, 128), 32, 6, 16), 16),
     WithPle(WithSwa(Dense(768, 6, 8, 2, 128, 2048), 64, 6, 64), 64),
     std::nullopt, "", "Q4_K_M", std::nullopt,
     &Gemma4Meta},
    {"gemma3", "dense, SWA (5 local : 1 global)", "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M", "gemma-4",
     kGemmaStandIn, 0x6e3,
     WithSwa(Dense(64, 6, 2, 1, 32, 128), 32, 6), WithSwa(Dense(768, 12, 4, 1, 256, 3072), 64, 6),
     WithSwa(Dense(1152, 26, 4, 1, 256, 6912, 32768), 512, 6), "Gemma3 1B", "Q4_K_M", WithSwa(Dense(256, 6, 4, 1, 64, 512), 32, 6),
     &Gemma3Meta},
    {"gemma2", "dense, SWA alternating, logit soft-capping", "bartowski/gemma-2-2b-it-GGUF:Q4_K_M", "gemma-4",
     kGemmaStandIn, 0x6e2,
     WithSwa(Dense(64, 4, 2, 1, 32, 128), 32, 2), WithSwa(Dense(1024, 8, 8, 4, 128, 4096), 64, 2),
     WithSwa(Dense(2304, 26, 8, 4, 256, 9216, 8192), 4096, 2), "Gemma2 2B", "Q4_K_M", std::nullopt,
     &Gemma2Meta},
    {"olmo", "dense MHA, non-parametric LayerNorm", "meshllm/olmo-7b-instruct-hf-parity-f16-gguf:F16", "gpt-neox",
     "", 0x01f0,
     Dense(64, 2, 4, 4, 16, 128), Dense(1024, 8, 16, 16, 64, 4096), std::nullopt, "", "F16", std::nullopt,
     &OlmoMeta},
    {"minimax-m27", "MoE on every layer, sigmoid routing, partial rotary", "unsloth/MiniMax-M2.7-GGUF:UD-Q2_K_XL", "gpt-2",
     "stand-in: GPT-2 BPE; MiniMax's 200k BPE is not in the tree", 0x3131,
     WithRope(WithMoe(Dense(64, 2, 4, 2, 16, 64), 4, 2, 64), 8),  // n_ff is the expert width here
     WithRope(WithMoe(Dense(768, 8, 8, 2, 128, 512), 16, 4, 512), 64), std::nullopt, "", "Q2_K", std::nullopt,
     &MiniMaxM2Meta},
    {"deepseek3", "DeepSeek-V3 shape: MLA, q-LoRA, grouped sigmoid MoE", "unsloth/DeepSeek-V3.2-GGUF:UD-Q4_K_XL", "deepseek-llm",
     "", 0xdee3,
     WithMoe(Mla(64, 3, 4, 128, 32, 32, 16, 16, 16, 1), 8, 2, 64, 1),
     WithMoe(Mla(768, 8, 8, 2048, 256, 256, 32, 64, 64, 1), 16, 4, 384, 1),
     std::nullopt, "", "Q4_K_M", std::nullopt,
     &DeepSeek3Meta},
}};

}  // namespace

std::string_view PresetName(Preset preset) {
  switch (preset) {
    case Preset::kTiny: return "tiny";
    case Preset::kBench: return "bench";
    case Preset::kReal: return "real";
    case Preset::kSmall: return "small";
  }
  return "?";
}

StatusOr<Preset> ParsePreset(std::string_view name) {
  if (name == "tiny") return Preset::kTiny;
  if (name == "bench") return Preset::kBench;
  if (name == "real") return Preset::kReal;
  if (name == "small") return Preset::kSmall;
  return absl::InvalidArgumentError(StrCat("unknown preset '", name, "' (expected tiny, bench, real or small)"));
}

const cache::FamilyRow& FamilySpec::row() const {
  static const cache::FamilyRow kUnknown{"", "", "", cache::MemoryKind::kKv, cache::PayloadKind::kResidentKv, false};
  const cache::FamilyRow* r = cache::FindFamilyByKey(key);
  return r ? *r : kUnknown;
}

std::span<const FamilySpec> Families() { return kFamilies; }

StatusOr<const FamilySpec*> FindFamily(std::string_view key) {
  std::vector<std::string_view> keys;
  for (const FamilySpec& f : kFamilies) {
    if (f.key == key) return &f;
    keys.push_back(f.key);
  }
  return absl::NotFoundError(StrCat("unknown family '", key, "'; known: ", fmt::format("{}", fmt::join(keys, ", "))));
}

std::string ZooFileName(const FamilySpec& family, std::string_view format) {
  if (format == "ref") format = family.ref_format;
  if (format.empty() || format == "F16") return StrCat(family.key, ".gguf");
  return StrCat(family.key, ".", format, ".gguf");
}

StatusOr<std::string> ParseZooFormat(std::string_view name) {
  // The formats llama-quantize takes that the CPU backend runs (its names, upper case).
  static constexpr std::string_view kFormats[] = {
      "F16",    "BF16",   "Q8_0",   "Q6_K",   "Q5_K_M",  "Q5_K_S", "Q5_0",    "Q5_1",   "Q4_K_M", "Q4_K_S",
      "Q4_0",   "Q4_1",   "Q3_K_M", "Q3_K_S", "Q3_K_L",  "Q2_K",   "Q2_K_S",  "IQ4_XS", "IQ4_NL", "IQ3_XXS",
      "IQ3_S",  "IQ3_M",  "IQ2_XXS", "IQ2_XS", "IQ2_S",  "IQ2_M",  "IQ1_S",   "IQ1_M",  "TQ1_0",  "TQ2_0"};
  if (name == "ref") return std::string(name);
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (std::find(std::begin(kFormats), std::end(kFormats), upper) != std::end(kFormats)) return upper;
  return absl::InvalidArgumentError(
      StrCat("unknown weight format '", name, "' (a llama-quantize type such as F16, Q8_0, Q4_K_M, IQ2_XS, or ref)"));
}

StatusOr<Dims> DimsFor(const FamilySpec& family, Preset preset) {
  switch (preset) {
    case Preset::kTiny: return family.tiny;
    case Preset::kBench: return family.bench;
    case Preset::kReal:
      if (family.real) return *family.real;
      return absl::NotFoundError(StrCat("family '", family.key,
                                              "' has no 'real' preset (its real size does not fit this machine)"));
    case Preset::kSmall:
      if (family.small) return *family.small;
      return absl::NotFoundError(StrCat("family '", family.key, "' has no 'small' preset"));
  }
  return absl::InvalidArgumentError("bad preset");
}

StatusOr<Metadata> BuildMetadata(const FamilySpec& family, Preset preset) {
  SKIPPY_ASSIGN_OR_RETURN(Dims dims, DimsFor(family, preset));
  Metadata out;
  Add(out, "general.architecture", std::string(family.arch()));
  Add(out, "general.name", StrCat("skippy-zoo ", family.display_name(), " (", PresetName(preset), ")"));
  Add(out, "general.description",
      StrCat("Synthetic-weight model generated by skippy-zoo: the ", family.display_name(),
                   " architecture (", family.arch_note, ") with deterministic random weights. ",
                   "Not a trained model; its outputs are meaningless text."));
  Add(out, "general.file_type", uint32_t{1});  // mostly F16
  Add(out, "skippy.synthetic", true);
  // A shape written under another architecture (tests) claims no family: it is what a model
  // outside the table looks like, which the policy learns.
  if (family.arch_override.empty()) {
    Add(out, "skippy.zoo.family", std::string(family.key));
  } else {
    Add(out, "skippy.zoo.shape_of", std::string(family.key));
  }
  Add(out, "skippy.zoo.preset", std::string(PresetName(preset)));
  Add(out, "skippy.zoo.seed", static_cast<uint32_t>(family.seed));
  Add(out, "skippy.zoo.generator_version", kGeneratorVersion);
  Add(out, "skippy.zoo.tokenizer_source", StrCat("models/ggml-vocab-", family.vocab, ".gguf"));
  Add(out, "skippy.zoo.tokenizer_note", std::string(family.vocab_note.empty() ? "real tokenizer" : family.vocab_note));
  family.arch_metadata(dims, family.arch(), out);
  return out;
}

uint64_t ApproxParameterCount(const FamilySpec& family, const Dims& d, uint64_t n_vocab) {
  const uint64_t embd = d.n_embd;
  uint64_t per_layer = 0;
  const uint64_t q_dim = static_cast<uint64_t>(d.n_head) * (d.head_dim ? d.head_dim : d.qk_nope_dim + d.rope_dim);
  const uint64_t kv_dim = static_cast<uint64_t>(d.n_head_kv) * d.head_dim;
  per_layer += embd * (q_dim * 2 + 2 * kv_dim);
  if (d.n_expert) per_layer += 3 * embd * d.n_ff_exp * (d.n_expert + d.n_expert_shared);
  else per_layer += 3 * embd * d.n_ff;
  if (d.ssm_d_inner) per_layer += embd * (3 * d.ssm_d_inner + 2 * d.ssm_n_group * d.ssm_d_state);
  uint64_t total = per_layer * d.n_layer + 2 * embd * n_vocab;
  if (d.n_embd_per_layer) total += n_vocab * d.n_embd_per_layer * d.n_layer;
  return total;
}

}  // namespace skippy::zoo
