#include "skippy/certify/state_handoff.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "skippy/cache/disk_tier.h"
#include "skippy/cache/payload_store.h"
#include "skippy/certify/logits.h"
#include "skippy/common/digest.h"
#include "skippy/common/stats.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"

#ifndef SKIPPY_LLAMA_COMMIT
#define SKIPPY_LLAMA_COMMIT "unknown"
#endif

namespace skippy::certify {

using cache::PayloadKind;
using nlohmann::json;
using runtime::Engine;
using runtime::Token;

namespace {

// Deterministic filler appended to short prompts (plain prose every tokenizer handles).
constexpr const char* kFiller =
    " The cache keeps the exact state of a shared prefix so the next request can continue from it"
    " without recomputing the tokens it has already seen.";

using Clock = std::chrono::steady_clock;


double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

std::string Hex(const std::vector<float>& logits) {
  return ToHex(Sha256(std::as_bytes(std::span(logits))));
}

}  // namespace

StatusOr<std::vector<Token>> BenchmarkTokens(const runtime::Model& model, const std::string& prompt,
                                             int32_t min_tokens) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (min_tokens <= 0) return absl::InvalidArgumentError("token count must be positive");
  std::string text = prompt;
  SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> tokens, model.Tokenize(text, /*add_special=*/true));
  // Bounded: each round adds ~25 tokens, so the loop ends; the cap guards absurd requests.
  for (int round = 0; static_cast<int32_t>(tokens.size()) < min_tokens; ++round) {
    if (round > 100000) return absl::InvalidArgumentError("cannot pad the prompt to the requested length");
    text += kFiller;
    SKIPPY_ASSIGN_OR_RETURN(tokens, model.Tokenize(text, /*add_special=*/true));
  }
  tokens.resize(static_cast<size_t>(min_tokens));
  return tokens;
}

StatusOr<StateHandoffResult> RunStateHandoff(const StateHandoffOptions& o) {
  if (o.prompt.empty()) return absl::InvalidArgumentError("--prompt is empty");
  if (o.prefix_token_count < 1) return absl::InvalidArgumentError("--prefix-token-count must be at least 1");
  if (o.cache_hit_repeats < 0) return absl::InvalidArgumentError("--cache-hit-repeats must be >= 0");
  if (o.lane_count < 1) return absl::InvalidArgumentError("--runtime-lane-count must be at least 1");
  if (o.suffix_token_count < 2 && !o.skip_suffix_prefill_check) {
    return absl::InvalidArgumentError("the suffix check needs at least 2 tokens");
  }
  if (o.state_layer_start.value_or(0) != 0 || o.state_stage_index.value_or(0) != 0 || o.stage_load_mode != "full") {
    return absl::UnimplementedError("only the whole-model stage is supported: layer ranges and staged loading are not");
  }

  runtime::EngineOptions eo;
  eo.model_path = o.model_path;
  eo.model_id = o.model_id;
  eo.context.n_ctx = o.ctx_size;
  eo.context.n_batch = o.batch_size;
  eo.context.n_ubatch = o.batch_size;
  eo.context.n_threads = o.threads;
  eo.context.flash_attn = o.flash_attn;
  eo.context.type_k = o.type_k;
  eo.context.type_v = o.type_v;
  eo.lane_count = o.lane_count;
  eo.cache_seq_count = 1;
  eo.n_gpu_layers = o.n_gpu_layers;
  SKIPPY_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Open(eo));
  const runtime::Model& model = engine->model();
  const int32_t n_layer_all = model.n_layer();
  if (o.layer_end.value_or(n_layer_all) != n_layer_all || o.state_layer_end.value_or(n_layer_all) != n_layer_all) {
    return absl::UnimplementedError(StrCat("only the whole model's ", n_layer_all,
                                           " layers are supported: a layer range ending before them is not"));
  }

  StateHandoffResult result;
  json& r = result.report;
  r["mode"] = "state-handoff";
  r["model_identity"] = {
      {"model_id", engine->options().model_id},
      {"model_path", o.model_path},
      {"model_sha256", engine->model_digest()},
      {"arch", model.arch()},
      {"name", model.MetaString("general.name").value_or("")},
      {"weight_format", model.WeightFormat()},
      {"family_key", engine->family().family_key},
      {"synthetic_weights", model.MetaString("skippy.synthetic").value_or("false") == "true"},
      {"llama_cpp_commit", SKIPPY_LLAMA_COMMIT},
      {"batch_invariant", runtime::BatchInvariant()},
      {"one_row_class", runtime::OneRowClass()},
      {"layer_start", 0},
      {"layer_end", n_layer_all},
      {"state_layer_start", o.state_layer_start.value_or(0)},
      {"state_layer_end", n_layer_all},
      {"state_stage_index", o.state_stage_index.value_or(0)},
      {"stage_load_mode", o.stage_load_mode},
  };
  const runtime::ContextOptions& eff = engine->context().options();
  r["runtime"] = {
      {"ctx_size", eff.n_ctx},          {"batch_size", eff.n_batch},     {"ubatch_size", eff.n_ubatch},
      {"threads", eff.n_threads},       {"flash_attn", eff.flash_attn},  {"type_k", eff.type_k},
      {"type_v", eff.type_v},           {"kv_unified", eff.kv_unified},  {"swa_full", eff.swa_full},
      {"runtime_lane_count", o.lane_count}, {"cache_sequences", engine->cache_seq_count()},
      {"n_gpu_layers", o.n_gpu_layers}, {"borrow_resident_hits", o.borrow_resident_hits},
      {"cache_decoded_result_hits", o.cache_decoded_result_hits},
  };
  r["family"] = {{"key", engine->family().family_key}, {"name", engine->family().display_name},
                 {"enabled", engine->family().enabled}, {"reason", engine->family().reason},
                 {"production_payload", std::string(cache::PayloadKindName(engine->family().payload))},
                 {"learned", engine->family().learned}};
  // An architecture outside the family table is what this run certifies: its learned payload is
  // exercised as if enabled, and the verdict decides whether it may be served.
  if (engine->family().learned) engine->EnableLearnedFamily();

  const PayloadKind kind = o.payload.value_or(engine->family().payload);
  r["state_payload_kind"] = std::string(cache::PayloadKindName(kind));
  r["requested_prefix_token_count"] = o.prefix_token_count;

  // Policy first: a disabled family or a refused payload is a verdict, never served.
  const bool diagnostic = !cache::IsProductionPayload(kind);
  if (Status s = cache::FamilyPolicy().ValidateRequest(engine->family(), kind, /*allow_diagnostic=*/true); !s.ok()) {
    r["status"] = "disabled";
    r["matches"] = false;
    r["reason"] = std::string(s.message());
    result.verdict = Verdict::kDisabled;
    return result;
  }
  if (o.borrow_resident_hits && kind != PayloadKind::kResidentKv) {
    return absl::InvalidArgumentError("--borrow-resident-hits applies to resident-kv only");
  }
  const bool from_disk = !o.hits_from_disk_dir.empty();
  if (from_disk && o.borrow_resident_hits) {
    return absl::InvalidArgumentError("--hits-from-disk and --borrow-resident-hits exclude each other");
  }
  r["restore_source"] = from_disk ? "disk" : "memory";

  // 1. Tokens: prefix + continuation (the benchmark prompt) + suffix-check tokens after it.
  const int32_t n = o.prefix_token_count;
  const int32_t suffix = o.skip_suffix_prefill_check ? 0 : o.suffix_token_count - 1;
  if (static_cast<uint64_t>(n) + 1 + suffix > eff.n_ctx) {
    return absl::InvalidArgumentError(StrCat("prompt of ", int64_t{n} + 1 + suffix, " tokens (prefix ", n,
                                             " + continuation + suffix check) is longer than the context of ",
                                             eff.n_ctx, " tokens"));
  }
  auto t0 = Clock::now();
  SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> all, BenchmarkTokens(model, o.prompt, n + 1 + suffix));
  r["tokenize_ms"] = MsSince(t0);
  SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> prompt_tokens, model.Tokenize(o.prompt, true));
  r["prompt_token_count"] = prompt_tokens.size();
  const std::span<const Token> prefix(all.data(), n);
  const std::span<const Token> cont(all.data() + n, 1);
  const std::span<const Token> suffix_tokens(all.data() + n + 1, suffix);
  // The text a server is sent: without the BOS it adds back itself.
  SKIPPY_ASSIGN_OR_RETURN(std::string bench_text,
                          model.Detokenize(std::span<const Token>(all.data(), n + 1), /*remove_special=*/true));
  r["benchmark_prompt_text"] = bench_text;
  r["benchmark_prompt_token_count"] = n + 1;
  {
    // Does the text re-tokenize to the same tokens (what llama-server will see: it adds BOS and
    // parses special tokens in prompts)?
    SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> again, model.Tokenize(bench_text, true, /*parse_special=*/true));
    r["benchmark_prompt_retokenizes_exactly"] =
        again.size() == static_cast<size_t>(n + 1) && std::equal(again.begin(), again.end(), all.begin());
  }

  const int32_t src = 0;
  const int32_t dst = o.lane_count > 1 ? 1 : 0;
  const int32_t cseq = engine->cache_seq(0);

  // 2. Source.
  SKIPPY_RETURN_IF_ERROR(engine->Clear(src));
  t0 = Clock::now();
  SKIPPY_ASSIGN_OR_RETURN(std::vector<float> prefix_logits, engine->Decode(src, prefix, 0));
  r["source_prefill_ms"] = MsSince(t0);

  SKIPPY_ASSIGN_OR_RETURN(std::unique_ptr<cache::PayloadStore> store, cache::PayloadStore::Create({}));
  runtime::ResidentRecord resident;
  cache::PayloadId payload_id = 0;
  cache::PutResult put;
  uint64_t state_bytes = 0;
  t0 = Clock::now();
  std::unique_ptr<cache::DiskTier> disk;
  std::optional<cache::TierHit> disk_hit;
  if (from_disk) {
    // The payload as the server's disk tier keeps it: written, the tier closed and opened again.
    SKIPPY_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, kind == PayloadKind::kResidentKv
                                                            ? engine->ExportResident(src)
                                                            : engine->ExportState(src, kind));
    r["source_export_ms"] = MsSince(t0);
    state_bytes = bytes.size();
    cache::CacheConfigIdentity id;
    id.model_id = engine->model_digest();
    id.layer_end = 1;
    id.llama_version = SKIPPY_LLAMA_COMMIT;
    id.n_ctx = eff.n_ctx;
    id.n_vocab = model.n_vocab();
    id.position_config = "skippy-correctness state-handoff";
    cache::DiskTierOptions dopt;
    dopt.dir = o.hits_from_disk_dir;
    dopt.min_free_bytes = 0;
    cache::PrefixRecord rec;
    rec.tokens.assign(prefix.begin(), prefix.end());
    rec.kind = kind;
    rec.classes = cache::BatchClasses::Of(rec.tokens.size(), {}, 2);
    {
      SKIPPY_ASSIGN_OR_RETURN(std::unique_ptr<cache::DiskTier> writer, cache::DiskTier::Open(dopt, id));
      (void)writer->Clear(std::nullopt);
      if (!writer->Put(rec, std::move(bytes))) return absl::InternalError("the disk tier refused the payload");
      writer->Flush();
      if (writer->Stats().writes != 1) return absl::InternalError("the disk tier did not write the payload");
    }
    SKIPPY_ASSIGN_OR_RETURN(disk, cache::DiskTier::Open(dopt, id));
    disk_hit = disk->Lookup("", rec.tokens);
    if (!disk_hit || disk_hit->usable_tokens != static_cast<size_t>(n)) {
      return absl::InternalError("the reopened disk tier does not hold the prefix");
    }
    r["disk_file_bytes"] = disk_hit->stored_bytes;
  } else if (kind == PayloadKind::kResidentKv) {
    SKIPPY_ASSIGN_OR_RETURN(resident, engine->RecordResident(src, n, cseq));
    r["source_export_ms"] = MsSince(t0);
    state_bytes = engine->StateBytes(cseq);
  } else {
    SKIPPY_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, engine->ExportState(src, kind));
    SKIPPY_ASSIGN_OR_RETURN(put, store->Put(std::as_bytes(std::span(bytes))));
    r["source_export_ms"] = MsSince(t0);
    payload_id = put.id;
    state_bytes = bytes.size();
  }

  t0 = Clock::now();
  SKIPPY_ASSIGN_OR_RETURN(std::vector<float> src_logits, engine->Decode(src, cont, n));
  r["source_decode_ms"] = MsSince(t0);
  std::vector<float> src_suffix_logits;
  if (suffix > 0) {
    SKIPPY_ASSIGN_OR_RETURN(src_suffix_logits, engine->Decode(src, suffix_tokens, n + 1));
  }
  SKIPPY_RETURN_IF_ERROR(engine->Clear(src));
  const Token src_token = Argmax(src_logits);
  r["source_predicted_token"] = src_token;
  r["source_logits_sha256"] = Hex(src_logits);
  r["recompute_total_ms"] = r["source_prefill_ms"].get<double>() + r["source_decode_ms"].get<double>();

  // What a hit costs: bring the payload into a lane (import), decode the continuation (decode).
  std::vector<uint8_t> disk_buffer;
  auto restore = [&](int32_t lane) -> Status {
    if (from_disk) {
      SKIPPY_RETURN_IF_ERROR(disk->Read(*disk_hit, disk_buffer));
      return kind == PayloadKind::kResidentKv ? engine->ImportResident(disk_buffer, lane, prefix)
                                              : engine->ImportState(disk_buffer, lane, kind);
    }
    if (kind == PayloadKind::kResidentKv) return engine->RestoreResident(resident, lane, n);
    SKIPPY_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, store->Get(payload_id));
    return engine->ImportState(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), lane, kind);
  };

  // 3. First restore, with the suffix check.
  t0 = Clock::now();
  SKIPPY_RETURN_IF_ERROR(restore(dst));
  r["restore_import_ms"] = MsSince(t0);
  t0 = Clock::now();
  SKIPPY_ASSIGN_OR_RETURN(std::vector<float> restored_logits, engine->Decode(dst, cont, n));
  r["restore_decode_ms"] = MsSince(t0);
  const Token restored_token = Argmax(restored_logits);
  r["restored_predicted_token"] = restored_token;
  const bool predicted_token_matches = restored_token == src_token;
  const bool restored_output_matches = BytesEqual(restored_logits, src_logits);
  r["restored_logits_max_abs_diff"] = MaxAbsDiff(restored_logits, src_logits);
  bool suffix_matches = true;
  if (suffix > 0) {
    SKIPPY_ASSIGN_OR_RETURN(std::vector<float> dst_suffix_logits, engine->Decode(dst, suffix_tokens, n + 1));
    suffix_matches = BytesEqual(dst_suffix_logits, src_suffix_logits);
    r["suffix_prefill_max_abs_diff"] = MaxAbsDiff(dst_suffix_logits, src_suffix_logits);
  }
  r["suffix_prefill_checked"] = suffix > 0;
  r["suffix_prefill_token_count"] = suffix;
  SKIPPY_RETURN_IF_ERROR(engine->Clear(dst));

  // 4. Cache hits in a row.
  std::vector<double> import_ms, decode_ms, total_ms;
  bool hits_match = true;
  bool borrowed = false;
  for (int32_t i = 0; i < o.cache_hit_repeats; ++i) {
    t0 = Clock::now();
    if (o.borrow_resident_hits && borrowed) {
      // The lane still shares the resident prefix from the previous hit: cut it back, no copy.
      SKIPPY_RETURN_IF_ERROR(engine->Truncate(dst, n));
    } else {
      SKIPPY_RETURN_IF_ERROR(restore(dst));
      borrowed = o.borrow_resident_hits;
    }
    import_ms.push_back(MsSince(t0));
    std::vector<float> logits;
    t0 = Clock::now();
    if (o.cache_decoded_result_hits) {
      // Decoded-result entry: the continuation's logits were stored with the prefix record.
      logits = src_logits;
    } else {
      SKIPPY_ASSIGN_OR_RETURN(logits, engine->Decode(dst, cont, n));
    }
    decode_ms.push_back(MsSince(t0));
    total_ms.push_back(import_ms.back() + decode_ms.back());
    if (o.cache_decoded_result_hits) {
      // The stored logits are the source's by construction; what can differ is the restored lane
      // they stand for. Untimed: its decode of the continuation must give them.
      SKIPPY_ASSIGN_OR_RETURN(std::vector<float> decoded, engine->Decode(dst, cont, n));
      hits_match = hits_match && BytesEqual(decoded, logits);
    } else {
      hits_match = hits_match && BytesEqual(logits, src_logits);
    }
    if (!o.borrow_resident_hits) SKIPPY_RETURN_IF_ERROR(engine->Clear(dst));
  }
  SKIPPY_RETURN_IF_ERROR(engine->Clear(dst));
  r["cache_hit_import_ms"] = import_ms;
  r["cache_hit_decode_ms"] = decode_ms;
  r["cache_hit_total_ms"] = Median(total_ms);
  r["cache_hit_speedup"] = total_ms.empty() ? 0.0 : r["recompute_total_ms"].get<double>() / std::max(1e-6, Median(total_ms));

  // 5. Information: a monolithic prefill of prefix + continuation in one batch.
  {
    SKIPPY_RETURN_IF_ERROR(engine->Clear(src));
    SKIPPY_ASSIGN_OR_RETURN(std::vector<float> mono, engine->Decode(src, std::span<const Token>(all.data(), n + 1), 0));
    SKIPPY_RETURN_IF_ERROR(engine->Clear(src));
    r["monolithic_predicted_token"] = Argmax(mono);
    r["monolithic_predicted_token_matches"] = Argmax(mono) == src_token;
    r["monolithic_max_abs_logit_diff"] = MaxAbsDiff(mono, src_logits);
  }

  // Payload accounting, and the physical limit of a copy: memcpy of the same number of bytes.
  r["state_bytes"] = state_bytes;
  if (state_bytes > 0) {
    std::vector<uint8_t> a(state_bytes, 1), b(state_bytes);
    std::vector<double> copy_ms;
    for (int i = 0; i < 7; ++i) {
      t0 = Clock::now();
      std::memcpy(b.data(), a.data(), a.size());
      copy_ms.push_back(MsSince(t0));
      a[i % a.size()] = b[(i * 7) % b.size()];  // keep the copies observable
    }
    r["state_memcpy_ms"] = Median(copy_ms);
  }
  json digest;
  if (from_disk) {
    const cache::DiskTierStats ds = disk->Stats();
    r["cache_storage_bytes"] = disk_hit->stored_bytes;
    r["cache_storage_method"] = "measured: the disk tier's entry file (header + payload)";
    r["disk_reads"] = ds.hits;
    r["disk_read_ms"] = ds.read_ms;
    digest = {{"kinds", {{std::string(cache::PayloadKindName(kind)), state_bytes}}},
              {"total_bytes", state_bytes}, {"blocks", json::array()}, {"unique_blocks", 0}, {"duplicate_blocks", 0},
              {"note", "one file in the disk tier, XXH3-128 verified on every read"}};
  } else if (kind == PayloadKind::kResidentKv) {
    r["cache_storage_bytes"] = state_bytes;
    r["cache_storage_method"] = "measured: llama_state_seq_get_size of the resident cache sequence";
    digest = {{"kinds", {{"resident-kv", state_bytes}}}, {"total_bytes", state_bytes}, {"blocks", json::array()},
              {"unique_blocks", 0}, {"duplicate_blocks", 0},
              {"note", "resident in the live KV cache; cells are shared, no bytes are exported"}};
  } else {
    const cache::PayloadStats stats = store->Stats();
    r["cache_storage_bytes"] = stats.physical_bytes;
    r["cache_storage_method"] = "measured: physical bytes in the payload store (1 MiB deduplicated blocks)";
    SKIPPY_ASSIGN_OR_RETURN(std::vector<cache::BlockDigest> blocks, store->BlockDigests(payload_id, true));
    json jb = json::array();
    for (size_t i = 0; i < blocks.size(); ++i) {
      jb.push_back({{"index", i}, {"bytes", blocks[i].size}, {"sha256", ToHex(blocks[i].sha256)}});
    }
    digest = {{"kinds", {{std::string(cache::PayloadKindName(kind)), state_bytes}}},
              {"total_bytes", state_bytes},
              {"physical_bytes", stats.physical_bytes},
              {"blocks", jb},
              {"unique_blocks", put.new_blocks},
              {"duplicate_blocks", put.shared_blocks}};
  }
  r["payload_digest"] = digest;

  r["predicted_token_matches"] = predicted_token_matches;
  r["restored_output_matches"] = restored_output_matches;
  r["suffix_prefill_matches"] = suffix_matches;
  r["cache_hit_matches"] = hits_match;
  const bool matches = predicted_token_matches && restored_output_matches && suffix_matches && hits_match;
  r["matches"] = matches;
  r["diagnostic_payload"] = diagnostic;
  r["status"] = matches ? "pass" : "mismatch";
  result.verdict = matches ? Verdict::kPass : Verdict::kMismatch;
  return result;
}

}  // namespace skippy::certify
