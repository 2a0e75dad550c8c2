// Exactness on the serving path: for dense (llama, glm4), SWA (gemma3), MoE + SWA (gemma4-a4b),
// MLA + MoE (deepseek2), MoE (minimax-m27) and hybrid (qwen3next, falcon-h1) families, a seeded
// generator of prompts that share prefixes -- new prompts on a few shared bases, divergence inside
// a stored prefix, exact repeats, and extensions of earlier prompts -- is sent to a cache-on server
// and to a --no-cache server with the same prefill chunking (128 tokens, so batches reach flash
// attention's tiled path), with flash attention off (the default: a hit may prefill 2+ tokens) and
// on (a hit prefills 64+). Greedy outputs (token ids) and every generated token's
// log-probabilities (n_probs, so the logits themselves) must be identical, and the cache must
// actually hit.
//
// Limit: with flash attention off the tiny zoo cannot tell a 1-row batch from a 2-row one (its
// 64-wide products of f16 values round alike either way; the bench zoo's do not), so the 2-row
// rule itself is proved by the batch-split check (tests/runtime, docs/evidence/batch-split).
#include <algorithm>
#include <gtest/gtest.h>

#include <array>

#include <chrono>
#include <random>
#include <thread>

#include "server_process.h"
#include "skippy/runtime/synthetic_model.h"
#include "skippy/zoo/zoo_spec.h"

namespace {

using nlohmann::json;
using skippy::server_test::PostJson;
using skippy::server_test::ServerProcess;

std::vector<std::vector<int>> GeneratePrompts(uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  auto tok = [&] { return std::uniform_int_distribution<int>(lo, hi - 1)(rng); };
  auto run = [&](int n) {
    std::vector<int> v;
    for (int i = 0; i < n; ++i) v.push_back(tok());
    return v;
  };
  auto len = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  // Long enough that hits leave the 64+ tokens a hit must prefill with flash attention on.
  std::vector<std::vector<int>> bases = {run(len(120, 200)), run(len(120, 200)), run(len(60, 100))};
  std::vector<std::vector<int>> prompts;
  // 0: base + new suffix; 1: divergence inside an earlier prompt; 2: exact repeat; 3: extension.
  const int kinds[] = {0, 0, 2, 1, 3, 0, 2, 1, 3, 1, 2, 3, 0, 2, 1, 3};
  for (int kind : kinds) {
    std::vector<int> p;
    if (kind == 0 || prompts.empty()) {
      p = bases[prompts.size() % bases.size()];
      auto s = run(len(1, 90));
      p.insert(p.end(), s.begin(), s.end());
    } else {
      const auto& prev = prompts[std::uniform_int_distribution<size_t>(0, prompts.size() - 1)(rng)];
      if (kind == 2) {
        p = prev;
      } else if (kind == 1) {
        p.assign(prev.begin(), prev.begin() + len(1, static_cast<int>(prev.size()) - 1));
        auto s = run(len(1, 80));
        p.insert(p.end(), s.begin(), s.end());
      } else {
        p = prev;
        auto s = run(len(1, 100));
        p.insert(p.end(), s.begin(), s.end());
      }
    }
    if (p.size() > 480) p.resize(480);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Runs the prompts against a cache-on server (the common flags plus `cache_flags`) and a
// --no-cache server with the same layout; returns the cache-on server's /cache/stats.
// Exact repeats of earlier prompts must be answered from decoded-result entries.
json CompareWithNoCache(const std::string& family, const std::vector<std::string>& cache_flags,
                        const std::string& tag) {
  // The record grid's price of a batch cut is given, not measured: the measure is of time, and on
  // a tiny model in a sanitizer build a cut priced at ~90 rows left no grid point to hit (the
  // measured price has its own test, GridBudget).
  std::vector<std::string> common = {"-c", "512", "--prefill-chunk", "128", "--cache-record-stride", "64",
                                     "--runtime-lane-count", "1", "--cache-cut-cost", "4"};
  common.insert(common.end(), cache_flags.begin(), cache_flags.end());
  auto on = ServerProcess::Start(family, common, family + tag + "-on");
  EXPECT_TRUE(on);
  std::vector<std::string> off_flags = common;
  off_flags.push_back("--no-cache");
  auto off = ServerProcess::Start(family, off_flags, family + tag + "-off");
  EXPECT_TRUE(off);
  if (!on || !off) return {};
  auto con = on->Client();
  auto coff = off->Client();
  // The smallest prefill batch the server proved at startup (2, or 64 with flash attention on
  // over stock kernels).
  const int min_batch = json::parse(con->Get("/cache/stats")->body)["batch_split"].value("min_batch", 0);
  EXPECT_GE(min_batch, 2);

  auto models = json::parse(con->Get("/v1/models")->body);
  const int n_vocab = models["data"][0]["meta"]["n_vocab"].get<int>();
  const auto prompts = GeneratePrompts(0x5eed + static_cast<uint32_t>(family.size()), 1000, std::min(n_vocab, 20000));

  size_t cached_tokens = 0, decoded_hits = 0, hits = 0, short_hits = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    json req = {{"prompt", prompts[i]}, {"n_predict", 8}, {"temperature", 0}, {"ignore_eos", true},
                {"return_tokens", true}, {"n_probs", 2}};
    auto [s1, a] = PostJson(*con, "/completion", req);
    auto [s2, b] = PostJson(*coff, "/completion", req);
    EXPECT_EQ(s1, 200) << a.dump() << on->LogTail();
    EXPECT_EQ(s2, 200) << b.dump() << off->LogTail();
    if (s1 != 200 || s2 != 200) return {};
    EXPECT_EQ(a["tokens"], b["tokens"]) << family << tag << " prompt " << i << " (" << prompts[i].size()
                                        << " tokens): cache " << a["skippy"].dump();
    // Log-probabilities are printed to round-trip precision: equal only for bit-identical logits.
    EXPECT_EQ(a["completion_probabilities"], b["completion_probabilities"])
        << family << tag << " prompt " << i << ": logits differ, cache " << a["skippy"].dump();
    EXPECT_EQ(b["tokens_cached"], 0);
    // Every prefill batch of a raw prompt (one long run) keeps min_batch rows: a hit that
    // prefills at all prefills at least that.
    if (a["skippy"]["cache_hit"].get<bool>() && !a["skippy"]["decoded_result_hit"].get<bool>()) {
      EXPECT_GE(a["timings"]["prompt_n"].get<int>(), min_batch) << family << tag << " prompt " << i;
      short_hits += a["timings"]["prompt_n"].get<int>() < 64 ? 1 : 0;
    }
    cached_tokens += a["tokens_cached"].get<size_t>();
    hits += a["skippy"]["cache_hit"].get<bool>() ? 1 : 0;
    decoded_hits += a["skippy"]["decoded_result_hit"].get<bool>() ? 1 : 0;
  }
  ::testing::Test::RecordProperty("cache_hits", static_cast<int>(hits));
  ::testing::Test::RecordProperty("cached_tokens", static_cast<int>(cached_tokens));
  EXPECT_GT(cached_tokens, 0u) << "the cache never hit: the comparison proves nothing";
  EXPECT_GE(hits, 4u);
  EXPECT_GE(decoded_hits, 1u) << "exact repeats should be answered from decoded-result entries";
  if (min_batch < 64) {
    EXPECT_GE(short_hits, 1u) << "no hit prefilled fewer than 64 tokens: the 2-row rule is unused";
  }
  auto metrics = con->Get("/metrics");
  EXPECT_TRUE(metrics);
  if (metrics) {
    EXPECT_EQ(metrics->body.find("skippy_cache_hits_total 0\n"), std::string::npos);
  }
  auto stats = con->Get("/cache/stats");
  EXPECT_TRUE(stats);
  return stats ? json::parse(stats->body) : json{};
}

std::string ParamName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

// Default layout: one KV stream per lane; ResidentKv entries live in the payload store.
class ServingExactness : public ::testing::TestWithParam<std::string> {};

void ExpectCacheOnMatchesNoCache(const std::string& family, bool flash_attn) {
  const json stats = CompareWithNoCache(family, {"-fa", flash_attn ? "on" : "off"}, flash_attn ? "-fa-on" : "-fa-off");
  ASSERT_FALSE(stats.is_null());
  EXPECT_TRUE(stats.value("enabled", false)) << stats.dump();
  EXPECT_TRUE(stats["batch_split"].value("pass", false)) << stats.dump();
  EXPECT_TRUE(stats["cut_cost"].value("given", false)) << stats.dump();
  if (stats.value("payload", "") == "resident-kv") {
    // A lane keeps its last prompt and is cut back to the shared prefix.
    EXPECT_GT(stats.value("lane_hits", 0), 0) << stats.dump();
    // Stored entries serve the other hits (sliding-window ones longer than the window, 32 tokens
    // in the tiny zoo, padded back to position 0 on import).
    EXPECT_GT(stats.value("stored_hits", 0), 0) << stats.dump();
  }
  if (stats.value("payload", "") == "kv-recurrent") {
    // The lane keeps its attention KV: hits within its last prompt restore only the recurrent state.
    EXPECT_GT(stats.value("recurrent_onto_hits", 0), 0) << stats.dump();
  }
}

TEST_P(ServingExactness, CacheOnMatchesNoCacheWithFlashAttentionOff) { ExpectCacheOnMatchesNoCache(GetParam(), false); }

TEST_P(ServingExactness, CacheOnMatchesNoCacheWithFlashAttentionOn) { ExpectCacheOnMatchesNoCache(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Families, ServingExactness, ::testing::Values("llama", "gemma3", "deepseek2", "qwen3next", "falcon-h1", "minimax-m27", "glm4",
                                           "gemma4-a4b"),
                         ParamName);

// Quantized weights (the small zoo, 256-wide matrices): Q4_K_M takes llama.cpp's repacked
// products, exact under any cut only with the batch-invariant patch; Q8_0 the plain ones.
INSTANTIATE_TEST_SUITE_P(Quantized, ServingExactness,
                         ::testing::Values("llama.Q4_K_M", "gemma3.Q4_K_M", "deepseek2.Q4_K_M", "qwen3next.Q4_K_M",
                                           "llama.Q8_0"),
                         ParamName);

// An architecture outside the family table (the tiny Qwen3 shape written as qwen2, which claims no
// zoo family): skippy-server learns a resident-kv payload from its memory, runs the certifier on the
// model at startup, turns the cache on only because it passed, and then serves it exactly.
TEST(LearnedFamily, AnArchitectureOutsideTheTableIsCertifiedAtStartupThenServedExactly) {
  skippy::zoo::FamilySpec spec = *skippy::zoo::FindFamily("qwen3").value();
  spec.arch_override = "qwen2";
  const std::string path =
      (std::filesystem::temp_directory_path() / skippy::StrCat("skippy-server-qwen2-", getpid(), ".gguf")).string();
  auto written = skippy::runtime::WriteSyntheticModel(spec, skippy::zoo::Preset::kTiny, SKIPPY_TEST_VOCAB_DIR, path);
  ASSERT_TRUE(written.ok()) << written.status();
  const json stats = CompareWithNoCache(path, {"-fa", "on"}, "-learned");
  std::filesystem::remove(path);
  ASSERT_FALSE(stats.is_null());
  EXPECT_TRUE(stats.value("enabled", false)) << stats.dump();
  EXPECT_EQ(stats.value("family", ""), "qwen2");
  EXPECT_EQ(stats.value("payload", ""), "resident-kv");
  ASSERT_TRUE(stats.contains("learned_family")) << stats.dump();
  EXPECT_TRUE(stats["learned_family"].value("pass", false)) << stats.dump();
}

// Words from a fixed list, seeded: chat message contents of a rough length.
std::string Words(uint32_t seed, int n) {
  static const char* kWords[] = {"river", "stone", "market", "signal", "lantern", "copper", "meadow", "harbor",
                                 "ledger", "orbit", "thistle", "vector", "canyon", "ember", "quartz", "willow"};
  std::mt19937 rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) out += std::string(i ? " " : "") + kWords[rng() % 16];
  return out;
}

// Chat prompts whose short messages (questions, the assistant header, short answers) follow long
// ones, with flash attention on: both servers prefill those rows in short batches
// (cache::BatchClasses), and a hit at a long message's end prefills only the short ones after it
// (fewer than 64 tokens); the second turn's short tail reaches 64 rows and turns long. The same tokens sent as a raw prompt are classed otherwise (one long
// run): the cache must not serve them from the chat's lane or entries past the first row of
// another class. Outputs and log-probabilities must equal a --no-cache run's.
void ExpectChatMatchesNoCache(const std::string& family, const std::vector<std::string>& flags = {}) {
  std::vector<std::string> common = {"-c", "1024", "--prefill-chunk", "128", "--cache-record-stride", "64",
                                     "--runtime-lane-count", "1", "-fa", "on"};
  common.insert(common.end(), flags.begin(), flags.end());
  auto on = ServerProcess::Start(family, common, family + "-chat-on");
  ASSERT_TRUE(on);
  std::vector<std::string> off_flags = common;
  off_flags.push_back("--no-cache");
  auto off = ServerProcess::Start(family, off_flags, family + "-chat-off");
  ASSERT_TRUE(off);
  auto con = on->Client();
  auto coff = off->Client();
  auto msg = [](const std::string& role, const std::string& content) {
    return json{{"role", role}, {"content", content}};
  };
  size_t short_hits = 0, hits = 0;
  // Sends one request to both servers; returns the cache-on server's answer text.
  auto both = [&](const std::string& path, json req, const std::string& what) -> std::string {
    req["temperature"] = 0;
    req["ignore_eos"] = true;
    req["return_tokens"] = true;
    const bool chat = req.contains("messages");
    if (chat) {
      req["max_tokens"] = 6;
      req["logprobs"] = true;
      req["top_logprobs"] = 2;
    } else {
      req["n_predict"] = 6;
      req["n_probs"] = 2;
    }
    auto [s1, a] = PostJson(*con, path, req);
    auto [s2, b] = PostJson(*coff, path, req);
    EXPECT_EQ(s1, 200) << a.dump() << on->LogTail();
    EXPECT_EQ(s2, 200) << b.dump() << off->LogTail();
    if (s1 != 200 || s2 != 200) return "";
    EXPECT_EQ(a["tokens"], b["tokens"]) << family << " " << what << ": cache " << a["skippy"].dump();
    const json pa = chat ? a["choices"][0]["logprobs"] : a["completion_probabilities"];
    const json pb = chat ? b["choices"][0]["logprobs"] : b["completion_probabilities"];
    EXPECT_FALSE(pa.is_null()) << a.dump();
    EXPECT_EQ(pa, pb) << family << " " << what << ": logits differ, cache " << a["skippy"].dump();
    if (a["skippy"]["cache_hit"].get<bool>()) {
      ++hits;
      if (!a["skippy"]["decoded_result_hit"].get<bool>() && a["timings"]["prompt_n"].get<int>() < 64) ++short_hits;
    }
    return chat ? a["choices"][0]["message"]["content"].get<std::string>() : a["content"].get<std::string>();
  };
  const json sys = msg("system", Words(1, 160));
  json first = {sys, msg("user", Words(2, 12))};
  const std::string a0 = both("/v1/chat/completions", {{"messages", first}}, "first question");
  both("/v1/chat/completions", {{"messages", {sys, msg("user", Words(3, 10))}}}, "second question");
  json turn = first;
  turn.push_back(msg("assistant", a0));
  turn.push_back(msg("user", Words(4, 9)));
  const std::string a1 = both("/v1/chat/completions", {{"messages", turn}}, "second turn");
  turn.push_back(msg("assistant", a1));
  turn.push_back(msg("user", Words(5, 90)));  // a long message (a tool result) between short ones
  turn.push_back(msg("assistant", "ok"));
  turn.push_back(msg("user", Words(6, 8)));
  both("/v1/chat/completions", {{"messages", turn}}, "third turn");
  both("/v1/chat/completions", {{"messages", {sys, msg("user", Words(3, 10))}}}, "repeat");
  // The third turn's tokens as a raw prompt: one long run.
  auto [st, rendered] = PostJson(*con, "/apply-template", {{"messages", turn}});
  ASSERT_EQ(st, 200) << rendered.dump();
  both("/completion", {{"prompt", rendered["prompt"]}}, "third turn as a raw prompt");
  both("/v1/chat/completions", {{"messages", turn}}, "third turn again");
  EXPECT_GE(hits, 4u);
  EXPECT_GE(short_hits, 1u) << "no hit prefilled only its short messages";
}

TEST(ChatExactness, ShortMessagesWithFlashAttentionOn) {
  for (const std::string family : {"llama", "gemma3", "qwen3next"}) ExpectChatMatchesNoCache(family);
}

// On the stock kernels flash attention draws a line at 64 rows, and the short messages take the
// short batch class (cache::BatchClasses): the same comparison must hold there too.
TEST(ChatExactness, ShortMessagesWithFlashAttentionOnStockKernels) {
  ExpectChatMatchesNoCache("gemma3", {"--no-batch-invariant"});
}

// A greedy completion of `req` (ignore_eos), with the tokens and two log-probabilities per token.
json AskGreedy(ServerProcess& p, json req) {
  req["temperature"] = 0;
  req["ignore_eos"] = true;
  req["return_tokens"] = true;
  req["n_probs"] = 2;
  auto [status, body] = PostJson(*p.Client(), "/completion", req);
  EXPECT_EQ(status, 200) << body.dump();
  return body;
}

// Lanes step together (--lane-batching, Engine::DecodeStep): four requests of different lengths
// sent at the same time to a four-lane server (so some lanes prefill while others decode) get the
// tokens and log-probabilities each gets alone, on a --no-cache server (no decoded results to
// answer repeats) and on a cache-on one. With the patch series' one-row class a lane's token is
// one row of the batch, and a hybrid family's lanes step together too.
void ExpectLanesStepExactly(const std::string& family) {
  SCOPED_TRACE(family);
  const std::vector<std::string> common = {"-c", "2048", "--runtime-lane-count", "4", "--lane-batching",
                                           "--lane-groups", "all"};
  std::vector<std::string> off_flags = common;
  off_flags.push_back("--no-cache");
  auto off = ServerProcess::Start(family, off_flags, "lanes-off");
  ASSERT_TRUE(off);
  auto on = ServerProcess::Start(family, common, "lanes-on");
  ASSERT_TRUE(on);
  auto stats = [](ServerProcess& p) { return json::parse(p.Client()->Get("/cache/stats")->body); };
  EXPECT_TRUE(stats(*off)["lane_batching"].value("on", false)) << stats(*off).dump();
  EXPECT_TRUE(stats(*on)["one_row_class"].value("on", false)) << stats(*on).dump();
  const json reqs[4] = {{{"prompt", Words(11, 12)}, {"n_predict", 48}},
                        {{"prompt", Words(12, 300)}, {"n_predict", 64}},
                        {{"prompt", Words(13, 60)}, {"n_predict", 40}},
                        {{"prompt", Words(14, 150)}, {"n_predict", 56}}};
  json alone[4];
  for (int i = 0; i < 4; ++i) alone[i] = AskGreedy(*off, reqs[i]);
  ASSERT_FALSE(alone[0]["completion_probabilities"].is_null());
  for (ServerProcess* server : {off.get(), on.get()}) {
    // All at once, until the server has stepped lanes in one batch (tiny models decode in about a
    // millisecond, so the requests may miss each other).
    for (int attempt = 0; attempt < 5 && stats(*server)["lane_batching"].value("steps_together", 0) == 0; ++attempt) {
      json together[4];
      std::vector<std::thread> others;
      for (int i = 1; i < 4; ++i) others.emplace_back([&, i] { together[i] = AskGreedy(*server, reqs[i]); });
      together[0] = AskGreedy(*server, reqs[0]);
      for (std::thread& t : others) t.join();
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(together[i]["tokens"], alone[i]["tokens"]) << "request " << i;
        EXPECT_EQ(together[i]["completion_probabilities"], alone[i]["completion_probabilities"]) << "request " << i;
      }
    }
    EXPECT_GT(stats(*server)["lane_batching"].value("steps_together", 0), 0) << "the requests never overlapped";
  }
  // A repeat on the cache-on server is a decoded-result hit: its first token needs no decode, the
  // rest go through the same steps.
  const json again = AskGreedy(*on, reqs[0]);
  EXPECT_TRUE(again["skippy"].value("decoded_result_hit", false)) << again["skippy"].dump();
  EXPECT_EQ(again["completion_probabilities"], alone[0]["completion_probabilities"]);
}

TEST(LaneBatching, AnAnswerDoesNotDependOnTheRequestsBesideIt) { ExpectLanesStepExactly("llama"); }

TEST(LaneBatching, HybridLanesStepTogetherExactly) { ExpectLanesStepExactly("qwen3next"); }

// Three requests that decode 200 tokens each and, 50 ms after them, one whose 1,200-word prompt
// is prefilled while they decode (a seed per server test); then each answer's tokens and
// log-probabilities must equal `alone`'s (the same requests asked one at a time).
std::array<json, 4> DecodingLanesBesideALongPrompt(int seed) {
  return {json{{"prompt", Words(seed + 1, 12)}, {"n_predict", 200}}, json{{"prompt", Words(seed + 2, 40)}, {"n_predict", 200}},
          json{{"prompt", Words(seed + 3, 25)}, {"n_predict", 200}}, json{{"prompt", Words(seed + 4, 1200)}, {"n_predict", 8}}};
}
void ExpectTheLongPromptBesideChangesNoAnswer(ServerProcess& server, const std::array<json, 4>& reqs,
                                             const std::array<json, 4>& alone) {
  std::array<json, 4> together;
  std::vector<std::thread> decoding;
  for (int i = 0; i < 3; ++i) decoding.emplace_back([&, i] { together[i] = AskGreedy(server, reqs[i]); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  together[3] = AskGreedy(server, reqs[3]);
  for (std::thread& t : decoding) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(together[i]["tokens"], alone[i]["tokens"]) << "request " << i;
    EXPECT_EQ(together[i]["completion_probabilities"], alone[i]["completion_probabilities"]) << "request " << i;
  }
}

// --tpot-slo-ms set to what a decode step of four lanes and 150 prefill rows took on a probe server
// (its /cache/stats "slo" costs). Three lanes decode 200 tokens each; 50 ms after they were sent, a
// 1,200-word prompt (batches of about 500 rows) arrives and is prefilled beside them, cut into
// pieces: about 150 rows while the lanes are on time, 32 while they are behind, whole only if all
// were late anyway (their last tokens due after 199 targets, several times what the steps take).
// Every answer's tokens and log-probabilities equal a --no-cache server's, asked one at a time,
// dense or hybrid. The tiny model's steps take milliseconds, so a busy machine may make the lanes
// late on one server; the cuts are counted over both.
void ExpectTpotCutsChangeNoAnswer(const std::string& family) {
  SCOPED_TRACE(family);
  const std::vector<std::string> layout = {"-c", "2048", "--runtime-lane-count", "4", "--lane-batching"};
  std::string slo;
  {
    auto probe = ServerProcess::Start(family, layout, "slo-probe");
    ASSERT_TRUE(probe);
    for (int i = 0; i < 3; ++i) {
      auto [status, body] = PostJson(*probe->Client(), "/completion",
                                     {{"prompt", Words(20 + i, 600)}, {"n_predict", 16}, {"ignore_eos", true}});
      ASSERT_EQ(status, 200) << body.dump();
    }
    const json costs = json::parse(probe->Client()->Get("/cache/stats")->body)["slo"];
    const double row_ms = costs.value("prefill_row_ms", 0.0), lane_ms = costs.value("decode_lane_ms", 0.0);
    ASSERT_GT(row_ms, 0) << costs.dump();
    ASSERT_GT(lane_ms, 0) << costs.dump();
    slo = std::to_string(4 * lane_ms + 150 * row_ms);
  }
  SCOPED_TRACE("--tpot-slo-ms " + slo);
  // A hybrid's records cut its prefill every 64 tokens anyway; on a grid of 1024 they do not.
  std::vector<std::string> flags = layout;
  for (const char* f : {"--tpot-slo-ms", slo.c_str(), "--cache-record-stride", "1024"}) flags.push_back(f);
  std::vector<std::string> off_flags = flags;
  off_flags.push_back("--no-cache");
  auto on = ServerProcess::Start(family, flags, "slo-on");
  auto off = ServerProcess::Start(family, off_flags, "slo-off");
  ASSERT_TRUE(on && off);
  const std::array<json, 4> reqs = DecodingLanesBesideALongPrompt(30);
  std::array<json, 4> alone;
  for (int i = 0; i < 4; ++i) alone[i] = AskGreedy(*off, reqs[i]);
  int batches_cut = 0;
  for (ServerProcess* server : {off.get(), on.get()}) {
    ExpectTheLongPromptBesideChangesNoAnswer(*server, reqs, alone);
    batches_cut += json::parse(server->Client()->Get("/cache/stats")->body)["slo"].value("batches_cut", 0);
  }
  EXPECT_GT(batches_cut, 0) << "no prefill was cut for the decoding lanes on either server";
}

TEST(TpotSlo, PrefillCutForTheDecodingLanesChangesNoAnswer) { ExpectTpotCutsChangeNoAnswer("llama"); }

TEST(TpotSlo, HybridPrefillCutForTheDecodingLanesChangesNoAnswer) { ExpectTpotCutsChangeNoAnswer("qwen3next"); }

// Mixed steps (--mixed-steps on, with lanes together on an attention-only model): three
// lanes decode 200 tokens each while a 1,200-word prompt arriving 50 ms later is prefilled beside
// them, so its chunks carry their tokens (Engine::DecodeStepWithChunks, one graph). Every answer's
// tokens and log-probabilities equal a --no-cache server's asked one at a time, on a --no-cache
// and a cache-on server, for dense, sliding-window and MLA families.
void ExpectMixedStepsChangeNoAnswer(const std::string& family) {
  SCOPED_TRACE(family);
  const std::vector<std::string> layout = {"-c", "2048", "--runtime-lane-count", "4", "--lane-batching",
                                           "--mixed-steps", "on"};
  std::vector<std::string> off_flags = layout;
  off_flags.push_back("--no-cache");
  auto on = ServerProcess::Start(family, layout, "mixed-on");
  auto off = ServerProcess::Start(family, off_flags, "mixed-off");
  ASSERT_TRUE(on && off);
  auto stats = [](ServerProcess& p) { return json::parse(p.Client()->Get("/cache/stats")->body); };
  for (ServerProcess* server : {off.get(), on.get()}) {
    const json mixed = stats(*server)["mixed_steps"];
    ASSERT_TRUE(mixed.value("on", false)) << mixed.dump();
    EXPECT_TRUE(mixed["check"].value("pass", false)) << mixed.dump();
  }
  const std::array<json, 4> reqs = DecodingLanesBesideALongPrompt(40);
  std::array<json, 4> alone;
  for (int i = 0; i < 4; ++i) alone[i] = AskGreedy(*off, reqs[i]);
  for (ServerProcess* server : {off.get(), on.get()}) {
    // Tiny models decode 200 tokens in a fraction of a second: try again if the prompt missed them.
    for (int attempt = 0; attempt < 5 && stats(*server)["mixed_steps"].value("steps_with_chunk", 0) == 0; ++attempt) {
      ExpectTheLongPromptBesideChangesNoAnswer(*server, reqs, alone);
    }
    EXPECT_GT(stats(*server)["mixed_steps"].value("steps_with_chunk", 0), 0) << "no lane stepped beside a chunk";
  }
}

TEST(MixedSteps, AnAnswerDoesNotDependOnTheChunkBesideIt) {
  for (const char* family : {"llama", "gemma3", "deepseek2"}) ExpectMixedStepsChangeNoAnswer(family);
}

// Chunks together (--chunks-together all, with lanes together on an attention-only model: every
// chunk of a turn that fits the ubatch; "on" leaves out those that do not pay, which on tiny models
// is most): four requests whose prompts are a fixed part and a part new in each round, sent at once
// to a four-lane server, so that their prompts (on the cache-on server after the first round, the
// new parts after a hit) are one turn's chunks in one graph (Engine::DecodeStepWithChunks).
// Every answer's tokens and log-probabilities equal a --no-cache server's asked one at a time, on
// that server and on a cache-on one, for dense, sliding-window and MLA families.
void ExpectChunksTogetherChangeNoAnswer(const std::string& family) {
  SCOPED_TRACE(family);
  const std::vector<std::string> layout = {"-c", "2048", "--runtime-lane-count", "4", "--lane-batching",
                                           "--lane-groups", "all", "--chunks-together", "all"};
  std::vector<std::string> off_flags = layout;
  off_flags.push_back("--no-cache");
  auto on = ServerProcess::Start(family, layout, "chunks-on");
  auto off = ServerProcess::Start(family, off_flags, "chunks-off");
  ASSERT_TRUE(on && off);
  auto together = [](ServerProcess& p) { return json::parse(p.Client()->Get("/cache/stats")->body)["chunks_together"]; };
  for (ServerProcess* server : {off.get(), on.get()}) {
    const json c = together(*server);
    ASSERT_TRUE(c.value("on", false)) << c.dump();
    EXPECT_TRUE(c["check"].value("pass", false)) << c.dump();
    EXPECT_TRUE(c["check"].value("chunks_together_equal", false)) << c.dump();
  }
  // Tiny models prefill a short prompt in about a millisecond: rounds until each server has run
  // chunks together, every answer checked in every round.
  for (int round = 0; round < 10 && (together(*off).value("groups", 0) == 0 || together(*on).value("groups", 0) == 0);
       ++round) {
    std::array<json, 4> reqs, alone;
    for (int i = 0; i < 4; ++i) {
      reqs[i] = {{"prompt", Words(80 + i, 30 + 15 * i) + " " + Words(100 + 4 * round + i, 8 + 5 * i)}, {"n_predict", 24}};
      alone[i] = AskGreedy(*off, reqs[i]);
    }
    for (ServerProcess* server : {off.get(), on.get()}) {
      std::array<json, 4> got;
      std::vector<std::thread> threads;
      for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = AskGreedy(*server, reqs[i]); });
      for (std::thread& t : threads) t.join();
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(got[i]["tokens"], alone[i]["tokens"]) << "request " << i << " round " << round;
        EXPECT_EQ(got[i]["completion_probabilities"], alone[i]["completion_probabilities"])
            << "request " << i << " round " << round;
      }
    }
  }
  EXPECT_GT(together(*off).value("groups", 0), 0) << "no chunks together on the --no-cache server";
  EXPECT_GT(together(*on).value("groups", 0), 0) << "no chunks together on the cache-on server";
}

TEST(ChunksTogether, AnAnswerDoesNotDependOnTheChunksBesideIt) {
  for (const char* family : {"llama", "gemma3", "deepseek2"}) ExpectChunksTogetherChangeNoAnswer(family);
}

// A hybrid's decoding lanes step apart from prompt chunks (its recurrent ops need equal runs), and
// a dense model's do by default (--mixed-steps off); so do its lanes' chunks (--chunks-together);
// /cache/stats says why.
TEST(MixedSteps, HybridsAndTheDefaultKeepStepsApart) {
  auto hybrid = ServerProcess::Start("qwen3next", {"-c", "1024", "--runtime-lane-count", "2", "--lane-batching",
                                                   "--mixed-steps", "on", "--chunks-together", "on"}, "mixed-hybrid");
  auto off = ServerProcess::Start("llama", {"-c", "1024", "--runtime-lane-count", "2", "--lane-batching"}, "mixed-default");
  ASSERT_TRUE(hybrid && off);
  const json h = json::parse(hybrid->Client()->Get("/cache/stats")->body);
  EXPECT_TRUE(h["lane_batching"].value("on", false)) << h.dump();
  EXPECT_FALSE(h["mixed_steps"].value("on", true)) << h["mixed_steps"].dump();
  EXPECT_NE(h["mixed_steps"].value("reason", std::string()).find("recurrent"), std::string::npos) << h["mixed_steps"].dump();
  const json o = json::parse(off->Client()->Get("/cache/stats")->body);
  EXPECT_FALSE(o["mixed_steps"].value("on", true)) << o["mixed_steps"].dump();
  EXPECT_EQ(o["mixed_steps"].value("reason", std::string()), "off (--mixed-steps off, the default)");
  EXPECT_FALSE(h["chunks_together"].value("on", true)) << h["chunks_together"].dump();
  EXPECT_NE(h["chunks_together"].value("reason", std::string()).find("recurrent"), std::string::npos)
      << h["chunks_together"].dump();
  EXPECT_FALSE(o["chunks_together"].value("on", true)) << o["chunks_together"].dump();
  EXPECT_EQ(o["chunks_together"].value("reason", std::string()), "off (--chunks-together off, the default)");
}

// By default the decoding lanes step in the groups that measured cheapest at startup
// (DecodeGroups): /cache/stats has a step cost per group size, and four requests at once get what
// each got alone.
TEST(LaneBatching, LanesStepInTheGroupsMeasuredCheapest) {
  auto server = ServerProcess::Start("llama", {"-c", "2048", "--runtime-lane-count", "4", "--lane-batching", "--no-cache"},
                                     "lane-groups");
  ASSERT_TRUE(server);
  const json lanes = json::parse(server->Client()->Get("/cache/stats")->body)["lane_batching"];
  EXPECT_EQ(lanes.value("groups", ""), "measured") << lanes.dump();
  const json step_ms = lanes["step_cost"]["step_ms"];
  ASSERT_EQ(step_ms.size(), 4u) << lanes.dump();
  for (const json& ms : step_ms) EXPECT_GT(ms.get<double>(), 0) << lanes.dump();
  auto ask = [&](int i) {
    const json req = {{"prompt", Words(20 + i, 20 + 40 * i)}, {"n_predict", 32}, {"temperature", 0},
                      {"ignore_eos", true}, {"n_probs", 2}};
    auto [status, body] = PostJson(*server->Client(), "/completion", req);
    EXPECT_EQ(status, 200) << body.dump();
    return body["completion_probabilities"];
  };
  json alone[4], together[4];
  for (int i = 0; i < 4; ++i) alone[i] = ask(i);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { together[i] = ask(i); });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_FALSE(alone[i].is_null());
    EXPECT_EQ(together[i], alone[i]) << "request " << i;
  }
}

// reqs sent 30 ms apart (so they take lanes 0, 1, ... in turn), each from a thread of its own, and
// every answer compared with alone's: tokens and log-probabilities.
template <size_t N>
void ExpectStaggeredAsAlone(ServerProcess& server, const std::array<json, N>& reqs, const std::array<json, N>& alone) {
  std::array<json, N> together;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < N; ++i) {
    threads.emplace_back([&, i] { together[i] = AskGreedy(server, reqs[i]); });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < N; ++i) {
    EXPECT_EQ(together[i]["tokens"], alone[i]["tokens"]) << "request " << i;
    EXPECT_EQ(together[i]["completion_probabilities"], alone[i]["completion_probabilities"]) << "request " << i;
  }
}

// Ragged steps (the default with lanes together on an attention-only or hybrid model): four
// requests sent 30 ms apart take lanes 0-3 in turn; the second asks for 80 tokens and the others
// for 300, so once it is done lanes 0, 2 and 3 decode, whose ids do not follow each other, in one
// graph. Every answer's tokens and log-probabilities equal a --no-cache server's asked one at a
// time, on that server and on a cache-on one, dense and hybrid.
void ExpectRaggedStepsChangeNoAnswer(const std::string& family) {
  SCOPED_TRACE(family);
  // --lane-groups all: every decoding lane steps in one group, whatever a startup measure on a
  // busy machine says steps cost (measured groups may keep lanes in steps of their own).
  const std::vector<std::string> layout = {"-c", "4096", "--runtime-lane-count", "4", "--lane-batching",
                                           "--lane-groups", "all"};
  std::vector<std::string> off_flags = layout;
  off_flags.push_back("--no-cache");
  auto on = ServerProcess::Start(family, layout, "ragged-cache-on");
  auto off = ServerProcess::Start(family, off_flags, "ragged-no-cache");
  ASSERT_TRUE(on && off);
  auto ragged = [](ServerProcess& p) {
    return json::parse(p.Client()->Get("/cache/stats")->body)["lane_batching"]["ragged_steps"];
  };
  for (ServerProcess* server : {off.get(), on.get()}) {
    const json r = ragged(*server);
    ASSERT_TRUE(r.value("on", false)) << r.dump();
    EXPECT_TRUE(r["check"].value("pass", false)) << r.dump();
  }
  std::array<json, 4> reqs;
  for (int i = 0; i < 4; ++i) reqs[i] = {{"prompt", Words(60 + i, 15 + 10 * i)}, {"n_predict", i == 1 ? 80 : 300}};
  std::array<json, 4> alone;
  for (int i = 0; i < 4; ++i) alone[i] = AskGreedy(*off, reqs[i]);
  for (ServerProcess* server : {off.get(), on.get()}) {
    // Tiny models decode fast: try again if the lanes did not overlap as planned.
    for (int attempt = 0; attempt < 5 && ragged(*server).value("steps", 0) == 0; ++attempt) {
      ExpectStaggeredAsAlone(*server, reqs, alone);
    }
    EXPECT_GT(ragged(*server).value("steps", 0), 0) << "no step of lanes apart";
  }
}

TEST(RaggedSteps, AnAnswerDoesNotDependOnWhichLanesStepBesideIt) {
  for (const char* family : {"llama", "qwen3next"}) ExpectRaggedStepsChangeNoAnswer(family);
}

// --ragged-steps off keeps a graph per run of consecutive lanes (lanes 0 and 2 step apart when the
// short request on lane 1 is done: no ragged step is counted, and every answer is the one it gets
// alone), and two lanes always follow each other; /cache/stats says why.
TEST(RaggedSteps, TheSwitchAndTwoLanesKeepRuns) {
  auto off = ServerProcess::Start("llama", {"-c", "1024", "--runtime-lane-count", "3", "--lane-batching",
                                            "--lane-groups", "all", "--ragged-steps", "off"}, "ragged-switch");
  auto two = ServerProcess::Start("llama", {"-c", "1024", "--runtime-lane-count", "2", "--lane-batching"}, "ragged-two");
  ASSERT_TRUE(off && two);
  const json o = json::parse(off->Client()->Get("/cache/stats")->body)["lane_batching"];
  EXPECT_TRUE(o.value("on", false)) << o.dump();
  EXPECT_FALSE(o["ragged_steps"].value("on", true)) << o.dump();
  EXPECT_EQ(o["ragged_steps"].value("reason", std::string()), "off (--ragged-steps off)");
  std::array<json, 3> reqs, alone;
  for (int i = 0; i < 3; ++i) reqs[i] = {{"prompt", Words(70 + i, 20 + 10 * i)}, {"n_predict", i == 1 ? 30 : 200}};
  for (int i = 0; i < 3; ++i) alone[i] = AskGreedy(*off, reqs[i]);
  ExpectStaggeredAsAlone(*off, reqs, alone);
  const json after = json::parse(off->Client()->Get("/cache/stats")->body)["lane_batching"];
  EXPECT_GT(after.value("steps_together", 0), 0) << after.dump();
  EXPECT_EQ(after["ragged_steps"].value("steps", -1), 0) << after.dump();
  const json t = json::parse(two->Client()->Get("/cache/stats")->body)["lane_batching"];
  EXPECT_FALSE(t["ragged_steps"].value("on", true)) << t.dump();
  EXPECT_NE(t["ragged_steps"].value("reason", std::string()).find("fewer than three lanes"), std::string::npos) << t.dump();
}

// /cache/stats of a server started with --one-row-class=auto, and whether its lone-step measure
// found the class within the tolerance; checks the measure's report and that the class is on
// exactly then.
std::pair<json, bool> MeasuredClass(ServerProcess& p) {
  const json stats = json::parse(p.Client()->Get("/cache/stats")->body);
  const json& cls = stats["one_row_class"];
  EXPECT_EQ(cls.value("mode", ""), "auto") << cls.dump();
  const json& measured = cls["measured"];
  if (!measured.contains("ratio") || !measured.contains("tolerance")) {
    ADD_FAILURE() << "nothing measured: " << cls.dump();
    return {stats, false};
  }
  // The fill stops after a second of prefill (a sanitizer build may reach only its first chunk).
  EXPECT_GE(measured.value("context", 0), 64) << "the lane holds a context before the measured steps";
  EXPECT_EQ(measured.value("pairs", 0), 7);
  EXPECT_GT(measured.value("one_row_class_ms", 0.0), 0);
  EXPECT_GT(measured.value("default_ms", 0.0), 0);
  const double tolerance = measured["tolerance"].get<double>();
  bool cheap = measured["ratio"].get<double>() <= tolerance;
  // One lane: where it passed at 512 tokens, also measured at a short context, and held to it there.
  if (cheap && tolerance == 1.03) {
    const json& short_context = measured.value("short_context", json::object());
    EXPECT_EQ(short_context.value("context", 0), 32) << cls.dump();
    EXPECT_EQ(short_context.value("pairs", 0), 7) << cls.dump();
    cheap = short_context.value("ratio", 2.0) <= tolerance;
  } else {
    EXPECT_FALSE(measured.contains("short_context")) << cls.dump();
  }
  EXPECT_EQ(cls.value("on", !cheap), cheap) << cls.dump();
  return {stats, cheap};
}

// --one-row-class=auto (the default) measures a lone decode step in the one-row class and without
// it at startup and keeps the class only where it costs at most the tolerance (10% more where 2+
// lanes may step together, 3% on one lane); /cache/stats says
// what it measured and decided. --lane-batching=auto (the default) then steps 2+ lanes together
// wherever the class is on. Whatever was decided, answers given to requests that run at the same
// time are those each gets alone. With one lane the class is decided the same way, and a lane in
// it keeps its answer for the next turn (ANextTurnRestoresThePreviousAnswer). --one-row-class=off
// measures nothing; --lane-batching=off never batches.
TEST(LaneBatching, AutoDecidesOnTheMeasuredLoneStep) {
  auto server = ServerProcess::Start("llama", {"-c", "1024", "--runtime-lane-count", "2", "--one-row-class=auto"},
                                     "lanes-auto");
  ASSERT_TRUE(server);
  const auto [stats, cheap] = MeasuredClass(*server);
  EXPECT_DOUBLE_EQ(stats["one_row_class"]["measured"].value("tolerance", 0.0), 1.10)
      << "two lanes that may step together hold a lone step to the lane tolerance";
  const json lanes = stats["lane_batching"];
  EXPECT_EQ(lanes.value("mode", ""), "auto") << lanes.dump();
  EXPECT_EQ(lanes.value("on", !cheap), cheap) << "llama passes the lane-batching check: " << lanes.dump();

  auto ask = [&](int i) {
    const json req = {{"prompt", Words(40 + i, 30 + 90 * i)}, {"n_predict", 24}, {"temperature", 0},
                      {"ignore_eos", true}, {"return_tokens", true}, {"n_probs", 2}};
    auto [status, body] = PostJson(*server->Client(), "/completion", req);
    EXPECT_EQ(status, 200) << body.dump();
    return body;
  };
  // Lane 0 held the measure's context: the first request on it starts from an empty lane.
  const json alone[2] = {ask(0), ask(1)};
  ASSERT_FALSE(alone[0]["completion_probabilities"].is_null());
  json together[2];
  std::thread other([&] { together[1] = ask(1); });
  together[0] = ask(0);
  other.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(together[i]["tokens"], alone[i]["tokens"]) << "request " << i;
    EXPECT_EQ(together[i]["completion_probabilities"], alone[i]["completion_probabilities"]) << "request " << i;
  }

  auto off = ServerProcess::Start("llama", {"-c", "1024", "--runtime-lane-count", "2", "--lane-batching=off",
                                            "--one-row-class=off"},
                                  "lanes-off");
  ASSERT_TRUE(off);
  const json o = json::parse(off->Client()->Get("/cache/stats")->body);
  EXPECT_EQ(o["lane_batching"].value("mode", ""), "off");
  EXPECT_FALSE(o["lane_batching"].value("on", true)) << o.dump();
  EXPECT_EQ(o["one_row_class"].value("mode", ""), "off");
  EXPECT_FALSE(o["one_row_class"].value("on", true));
  EXPECT_FALSE(o["one_row_class"].contains("measured")) << "nothing to measure when the class is off";
}

// n token ids, a deterministic run that differs with `from` (BranchPoint documents and questions).
std::vector<int> TokenRun(int from, int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(1000 + (from + i * 7) % 5000);
  return v;
}

// A greedy completion of token ids (AskGreedy).
json AskTokens(ServerProcess& p, const std::vector<int>& prompt, int n) {
  return AskGreedy(p, {{"prompt", prompt}, {"n_predict", n}});
}

// A conversation's second turn on `p`: a 200-token first prompt (TokenRun(from)), the 24 tokens
// the server answered it with (all sent back, though the last was sampled and never decoded into
// the lane), and a 30-token question.
std::vector<int> NextTurn(ServerProcess& p, int from) {
  std::vector<int> turn = TokenRun(from, 200);
  const std::vector<int> answer = AskTokens(p, turn, 24)["tokens"].get<std::vector<int>>();
  EXPECT_EQ(answer.size(), 24u);
  turn.insert(turn.end(), answer.begin(), answer.end());
  for (int t : TokenRun(from + 11, 30)) turn.push_back(t);
  return turn;
}

// `turn` (a NextTurn) restores the first prompt and the 23 decoded answer tokens from `tier`, and
// answers with the tokens and log-probabilities of `off` (a --no-cache server).
void ExpectAnswerRestored(ServerProcess& on, ServerProcess& off, const std::vector<int>& turn, const std::string& tier) {
  const json b = AskTokens(on, turn, 16);
  EXPECT_EQ(b["timings"].value("cache_n", -1), 200 + 23) << b["timings"].dump();
  EXPECT_EQ(b["skippy"].value("cache_tier", ""), tier) << b["skippy"].dump();
  const json ref = AskTokens(off, turn, 16);
  EXPECT_EQ(b["tokens"], ref["tokens"]);
  EXPECT_EQ(b["completion_probabilities"], ref["completion_probabilities"]);
}

// The exchange as an entry: another prompt takes the lane between a conversation's two turns, and
// the second still restores the answer, from memory. Returns /cache/stats.
json ExpectExchangeEntryServes(ServerProcess& on, ServerProcess& off) {
  const std::vector<int> turn = NextTurn(on, 7);
  (void)AskTokens(on, TokenRun(5, 150), 4);
  ExpectAnswerRestored(on, off, turn, "memory");
  return json::parse(on.Client()->Get("/cache/stats")->body);
}

// With the one-row class (--lane-batching) a generated token's KV is the KV it gets as a prompt
// row, so the lane keeps the answer too: a next turn that sends the previous prompt, the answer's
// tokens and a new question restores all of the first two, and its log-probabilities equal a
// --no-cache server's; the exchange is also recorded as an entry, which serves the turn once
// another prompt has taken the lane. --one-row-class does the same on one lane. Without the class
// only the previous prompt is restored.
TEST(LaneBatching, ANextTurnRestoresThePreviousAnswer) {
  const std::vector<std::string> batching = {"-c", "1024", "--runtime-lane-count", "2", "--lane-batching"};
  std::vector<std::string> off_flags = batching;
  off_flags.push_back("--no-cache");
  auto on = ServerProcess::Start("llama", batching, "turns-on");
  ASSERT_TRUE(on);
  auto off = ServerProcess::Start("llama", off_flags, "turns-off");
  ASSERT_TRUE(off);
  auto plain = ServerProcess::Start(
      "llama", {"-c", "1024", "--runtime-lane-count", "2", "--lane-batching=off", "--answer-prefill-idle-ms", "-1"},
      "turns-plain");
  ASSERT_TRUE(plain);
  // One lane: nothing to batch, the class alone keeps the answer.
  auto single = ServerProcess::Start("llama", {"-c", "1024", "--one-row-class"}, "turns-single");
  ASSERT_TRUE(single);
  ExpectAnswerRestored(*single, *off, NextTurn(*single, 3), "lane");
  ExpectAnswerRestored(*on, *off, NextTurn(*on, 3), "lane");
  const json stats = ExpectExchangeEntryServes(*on, *off);
  EXPECT_GE(stats.value("answer_records", 0), 1) << stats.dump();
  const json p = AskTokens(*plain, NextTurn(*plain, 3), 16);
  EXPECT_EQ(p["timings"].value("cache_n", -1), 200)
      << "without the one-row class or answer prefill the answer is recomputed: " << p["timings"].dump();
}

// A hybrid lane cannot be cut back (its recurrent state has moved on), so it serves the next turn
// only when that turn extends everything it holds. With the one-row class that is the previous
// prompt and the tokens decoded into it: the turn prefills only the new question, from the lane,
// with a --no-cache server's log-probabilities; the exchange is also an entry, which restores the
// turn (whole state) once another prompt has taken the lane. Without the class the lane holds
// answer tokens of another class than prompt rows, and the turn restores the previous prompt's
// entry (its recurrent state onto the lane) and prefills the answer again.
TEST(LaneBatching, AHybridNextTurnContinuesTheLane) {
  const std::vector<std::string> flags = {"-c", "1024", "--one-row-class"};
  std::vector<std::string> off_flags = flags;
  off_flags.push_back("--no-cache");
  auto on = ServerProcess::Start("qwen3next", flags, "hybrid-turns-on");
  ASSERT_TRUE(on);
  auto off = ServerProcess::Start("qwen3next", off_flags, "hybrid-turns-off");
  ASSERT_TRUE(off);
  auto plain = ServerProcess::Start("qwen3next", {"-c", "1024", "--answer-prefill-idle-ms", "-1"}, "hybrid-turns-plain");
  ASSERT_TRUE(plain);
  ExpectAnswerRestored(*on, *off, NextTurn(*on, 3), "lane");
  const json stats = ExpectExchangeEntryServes(*on, *off);
  EXPECT_GE(stats.value("answer_records", 0), 2) << stats.dump();
  const json p = AskTokens(*plain, NextTurn(*plain, 3), 16);
  EXPECT_EQ(p["timings"].value("cache_n", -1), 200)
      << "without the one-row class or answer prefill the answer is prefilled again: " << p["timings"].dump();
}

// One lane with --one-row-class=auto: the class is measured and decided as with more lanes, and
// lanes never step together. A lane in the class keeps the tokens it generated as prompt KV, so the
// conversation's next turn restores the answer from the lane; without it, only the prompt (answer
// prefill is off here). Either way the turn's tokens and log-probabilities equal those of a
// --no-cache server pinned to the class that was decided.
TEST(LaneBatching, OneLaneDecidesTheClassOnTheMeasuredLoneStep) {
  auto one = ServerProcess::Start("llama", {"-c", "1024", "--one-row-class=auto", "--answer-prefill-idle-ms", "-1"},
                                  "class-auto-one");
  ASSERT_TRUE(one);
  const auto [stats, cheap] = MeasuredClass(*one);
  EXPECT_DOUBLE_EQ(stats["one_row_class"]["measured"].value("tolerance", 0.0), 1.03)
      << "one lane holds a lone step to the parity tolerance";
  EXPECT_FALSE(stats["lane_batching"].value("on", true)) << stats["lane_batching"].dump();
  EXPECT_EQ(stats["lane_batching"].value("reason", ""), "one lane");
  auto off = ServerProcess::Start("llama", {"-c", "1024", "--no-cache", cheap ? "--one-row-class=on" : "--one-row-class=off"},
                                  "class-auto-ref");
  ASSERT_TRUE(off);
  const std::vector<int> turn = NextTurn(*one, 3);
  const json b = AskTokens(*one, turn, 16);
  EXPECT_EQ(b["timings"].value("cache_n", -1), cheap ? 223 : 200)
      << (cheap ? "in the class the lane keeps the 23 decoded answer tokens" : "without it only the prompt")
      << b["timings"].dump();
  const json ref = AskTokens(*off, turn, 16);
  EXPECT_EQ(b["tokens"], ref["tokens"]);
  EXPECT_EQ(b["completion_probabilities"], ref["completion_probabilities"]);
}

// /cache/stats once its answer_records reach `n` (answer prefill runs once the server is idle), or
// after 20 s.
json WaitForAnswerRecords(ServerProcess& p, int n) {
  json stats;
  for (int i = 0; i < 200; ++i) {
    stats = json::parse(p.Client()->Get("/cache/stats")->body);
    if (stats.value("answer_records", 0) >= n) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return stats;
}

// Answer prefill, the default (no one-row class): a decoded token is a class of its own, so once
// the server is idle the lane computes the answer again as prompt rows and records the exchange.
// The next turn then restores the previous prompt and the 23 decoded answer tokens, from the lane
// or, once another prompt took it, from the exchange entry, with a --no-cache server's
// log-probabilities; also when another conversation took the lane before the answer was prefilled
// (deferred, then resumed from the prompt's entry). Dense, sliding-window and hybrid (which first
// gets the prompt end's recurrent state back) families.
TEST(AnswerPrefill, ANextTurnRestoresTheAnswerComputedWhileIdle) {
  for (const std::string family : {"llama", "gemma3", "qwen3next"}) {
    SCOPED_TRACE(family);
    auto on = ServerProcess::Start(family, {"-c", "1024"}, family + "-answer-on");
    ASSERT_TRUE(on);
    auto off = ServerProcess::Start(family, {"-c", "1024", "--no-cache"}, family + "-answer-off");
    ASSERT_TRUE(off);
    const std::vector<int> turn = NextTurn(*on, 3);
    json stats = WaitForAnswerRecords(*on, 1);
    EXPECT_EQ(stats.value("answer_records", 0), 1) << stats.dump();
    EXPECT_EQ(stats.value("answer_prefill_tokens", 0), 23) << stats.dump();
    ExpectAnswerRestored(*on, *off, turn, "lane");
    // That turn was an exchange too; then a second conversation, whose lane another prompt takes
    // before its next turn.
    EXPECT_EQ(WaitForAnswerRecords(*on, 2).value("answer_records", 0), 2);
    const std::vector<int> second = NextTurn(*on, 7);
    EXPECT_EQ(WaitForAnswerRecords(*on, 3).value("answer_records", 0), 3);
    (void)AskTokens(*on, TokenRun(5, 150), 4);
    ExpectAnswerRestored(*on, *off, second, "memory");
    // Deferred: another conversation takes the lane before the server has been idle for 300 ms.
    // Once idle, the older answer goes first: its prompt's entry comes back into the lane (a
    // padded import on gemma3, a whole state on qwen3next), the answer is prefilled there, and the
    // newer one's after it.
    auto deferred = ServerProcess::Start(family, {"-c", "1024", "--answer-prefill-idle-ms", "300"}, family + "-answer-deferred");
    ASSERT_TRUE(deferred);
    const std::vector<int> third = NextTurn(*deferred, 9);
    (void)AskTokens(*deferred, TokenRun(5, 150), 4);
    stats = WaitForAnswerRecords(*deferred, 2);
    EXPECT_EQ(stats.value("answer_records", 0), 2) << stats.dump();
    EXPECT_EQ(stats.value("answers_dropped", -1), 0) << stats.dump();
    ExpectAnswerRestored(*deferred, *off, third, "memory");
  }
}

// A conversation sent as text: the client sends back the reply it got, as text, and a new message.
// On the synthetic zoo the reply tokenizes to other tokens than the ones generated (and carries
// U+FFFD where the generated bytes were not UTF-8), so the tokens generated into the lane do not
// serve the next turn. The idle work prefills what that turn holds after the prompt instead (the
// reply tokenized again and, for a chat, the template's end of turn and next header): the turn
// restores everything before its new part (where its tokens and those of the same turn with
// another new part part), with a --no-cache server's tokens and log-probabilities. As chat
// messages and as a text prompt, without the one-row class and with it (where the lane keeps the
// tokens generated and idle work prefills the next turn's from where the two part). In the text
// round another conversation takes the lane before idle time (300 ms), so the answer waits in the
// deferred queue and is resumed from its prompt's entry.
TEST(AnswerPrefill, ANextTurnSentAsTextRestoresEverythingBeforeItsNewPart) {
  auto msg = [](const std::string& role, const std::string& content) {
    return json{{"role", role}, {"content", content}};
  };
  auto ask = [](ServerProcess& p, json req, int n) {
    const bool chat = req.contains("messages");
    req.update({{"temperature", 0}, {"ignore_eos", true}, {"return_tokens", true}});
    if (chat) {
      req.update({{"max_tokens", n}, {"logprobs", true}, {"top_logprobs", 2}});
    } else {
      req.update({{"n_predict", n}, {"n_probs", 2}});
    }
    auto [status, body] = PostJson(*p.Client(), chat ? "/v1/chat/completions" : "/completion", req);
    EXPECT_EQ(status, 200) << body.dump();
    return body;
  };
  auto tokens = [](ServerProcess& p, const json& req) {
    const bool chat = req.contains("messages");
    auto [status, body] = PostJson(*p.Client(), chat ? "/cache/prompt-key?endpoint=chat" : "/cache/prompt-key?endpoint=completion", req);
    EXPECT_EQ(status, 200) << body.dump();
    return body["tokens"].get<std::vector<int>>();
  };
  auto restored = [](const json& a) {
    return a.contains("usage") ? a["usage"]["prompt_tokens_details"].value("cached_tokens", -1) : a.value("tokens_cached", -1);
  };
  auto probs = [](const json& a) { return a.contains("choices") ? a["choices"][0]["logprobs"] : a["completion_probabilities"]; };
  // /cache/stats once the answers given reach `n` records and idle work has none left.
  auto idle_done = [](ServerProcess& p, int n) {
    json stats;
    for (int i = 0; i < 200; ++i) {
      stats = json::parse(p.Client()->Get("/cache/stats")->body);
      if (stats.value("answer_records", 0) >= n && stats.value("answers_pending", 1) == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return stats;
  };
  for (const std::string cls : {"off", "on"}) {
    for (const std::string family : {"llama", "gemma3", "qwen3next"}) {
      SCOPED_TRACE(family + ", one-row class " + cls);
      const std::string pin = "--one-row-class=" + cls;
      auto on = ServerProcess::Start(family, {"-c", "1024", pin, "--answer-prefill-idle-ms", "300"},
                                     family + "-text-answer-on-" + cls);
      ASSERT_TRUE(on);
      auto off = ServerProcess::Start(family, {"-c", "1024", "--no-cache", pin}, family + "-text-answer-off-" + cls);
      ASSERT_TRUE(off);
      const json messages = {msg("system", Words(1, 120)), msg("user", Words(2, 12))};
      int answers = 0;  // answers given on `on`
      const std::string text = "System: " + Words(3, 120) + "\nUser: " + Words(4, 12) + "\nAssistant:";
      for (const json& first : {json{{"messages", messages}}, json{{"prompt", text}}}) {
        const bool chat = first.contains("messages");
        SCOPED_TRACE(chat ? "chat" : "text");
        const json a0 = ask(*on, first, 24);
        const std::string reply = chat ? a0["choices"][0]["message"]["content"].get<std::string>() : a0["content"].get<std::string>();
        if (!chat) {
          (void)ask(*on, json{{"prompt", "Other: " + Words(7, 80)}}, 4);
          ++answers;
        }
        // Every answer so far is prefilled (the chat's next turn's too, on the text turn); in the
        // class, also recorded as decoded when its job finished.
        const json stats = idle_done(*on, ++answers);
        EXPECT_EQ(stats.value("answers_pending", 1), 0) << stats.dump();
        if (cls == "off") {
          EXPECT_EQ(stats.value("answer_records", 0), answers) << stats.dump();
        }
        EXPECT_EQ(stats.value("answers_dropped", 1), 0) << stats.dump();
        // The next turn, and the same turn with other new parts: the tokens before its new part are
        // those all of them share (for text, a token may join the reply's end to what follows).
        json turn = first;
        std::vector<json> others(chat ? 1 : 2, first);
        if (chat) {
          turn["messages"].push_back(msg("assistant", reply));
          turn["messages"].push_back(msg("user", Words(5, 9)));
          others[0]["messages"].push_back(msg("assistant", reply));
          others[0]["messages"].push_back(msg("user", "0 " + Words(6, 9)));
        } else {
          turn["prompt"] = text + reply + "\nUser: " + Words(5, 9) + "\nAssistant:";
          others[0]["prompt"] = text + reply + "x" + Words(6, 9);
          others[1]["prompt"] = text + reply + " " + Words(6, 9);
        }
        const std::vector<int> t = tokens(*on, turn);
        auto before_new = static_cast<int>(t.size());
        for (const json& other : others) {
          const std::vector<int> o = tokens(*on, other);
          before_new = std::min(before_new, static_cast<int>(std::mismatch(t.begin(), t.end(), o.begin(), o.end()).first - t.begin()));
        }
        EXPECT_GT(before_new, static_cast<int>(tokens(*on, first).size()));
        const json a = ask(*on, turn, 8), b = ask(*off, turn, 8);
        ++answers;
        EXPECT_EQ(restored(a), before_new) << a["skippy"].dump() << " " << stats.dump();
        EXPECT_EQ(a["tokens"], b["tokens"]);
        EXPECT_EQ(probs(a), probs(b));
      }
    }
  }
}

// The record grid's budget: skippy-server measures what a batch cut costs at startup (where it plans
// exact-boundary records; ServingExactness checks what it then serves against --no-cache), takes a
// given cost as it is, and measures nothing without a budget.
TEST(GridBudget, TheCutCostIsMeasuredAtStartupGivenOrNotNeeded) {
  for (const std::string family : {"qwen3next", "gemma3"}) {
    auto measured = ServerProcess::Start(family, {"-c", "512"}, family + "-cut-measured");
    auto given = ServerProcess::Start(family, {"-c", "512", "--cache-cut-cost", "7"}, family + "-cut-given");
    auto none = ServerProcess::Start(family, {"-c", "512", "--cache-grid-budget", "0"}, family + "-cut-none");
    ASSERT_TRUE(measured && given && none);
    const json m = json::parse(measured->Client()->Get("/cache/stats")->body)["cut_cost"];
    ASSERT_TRUE(m.is_object()) << family;
    EXPECT_EQ(m.value("pieces", 0), 3) << m.dump();
    EXPECT_GT(m.value("rows", 0), 0) << m.dump();
    EXPECT_GT(m.value("whole_ms", 0.0), 0.0) << m.dump();
    EXPECT_GE(m.value("cost_rows", -1.0), 0.0) << m.dump();
    const json g = json::parse(given->Client()->Get("/cache/stats")->body)["cut_cost"];
    EXPECT_EQ(g.value("cost_rows", 0.0), 7.0) << g.dump();
    EXPECT_TRUE(g.value("given", false)) << g.dump();
    EXPECT_TRUE(json::parse(none->Client()->Get("/cache/stats")->body)["cut_cost"].is_null()) << family;
  }
}

// A document asked about with a second question branches off the first question's path at the
// document's end; that request records there (RestoreOutcome::branch), so a third question
// restores the whole document, for a hybrid (KvRecurrent) and a sliding-window family (exact-only
// ResidentKv entries). With a fresh lane each time (another document in between), only stored
// entries can serve it.
// The branch record is not a grid point: the same holds with the grid held to a budget, a dear
// one, that leaves only its longest point.
TEST(BranchPoint, ThirdQuestionOnADocumentRestoresTheWholeDocument) {
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"qwen3next", "0"}, {"gemma3", "0"}, {"qwen3next", "0.02"}, {"gemma3", "0.02"}};
  for (const auto& [family, budget] : runs) {
    SCOPED_TRACE(family + " --cache-grid-budget " + budget);
    auto on = ServerProcess::Start(family,
                                   {"-c", "512", "--cache-record-stride", "64", "--cache-grid-budget", budget,
                                    "--cache-cut-cost", "1000"},
                                   family + "-branch-" + budget);
    ASSERT_TRUE(on);
    auto c = on->Client();
    const std::vector<int> doc = TokenRun(0, 201), other = TokenRun(3, 150);
    std::vector<size_t> cached;
    for (int q = 0; q < 3; ++q) {
      std::vector<int> prompt = doc;
      for (int t : TokenRun(100 + 31 * q, 20)) prompt.push_back(t);
      auto [st, a] = PostJson(*c, "/completion", {{"prompt", prompt}, {"n_predict", 2}, {"temperature", 0}});
      ASSERT_EQ(st, 200) << a.dump();
      cached.push_back(a["tokens_cached"].get<size_t>());
      auto [st2, b] = PostJson(*c, "/completion", {{"prompt", other}, {"n_predict", 2}, {"temperature", 0}});
      ASSERT_EQ(st2, 200) << b.dump();
    }
    // The longest grid point below the branch (128) is kept under any budget.
    EXPECT_EQ(cached[1], 128u) << "the second question restores the grid point below the branch";
    EXPECT_EQ(cached[2], doc.size()) << "the third question should restore the document exactly";
  }
}

// Sliding-window family, two questions on a document back to back: the second is served by cutting
// the lane back to the document's end, so nothing of the document is prefilled and the plan records
// nothing there; the cut itself is recorded (an exact-only entry, the document is longer than the
// window). After another prompt takes the lane, a third question restores the whole document
// (without that record: a grid point, 128).
TEST(BranchPoint, ALaneCutAtABranchIsRecorded) {
  auto on = ServerProcess::Start("gemma3", {"-c", "512", "--cache-record-stride", "64"}, "gemma3-lane-branch");
  ASSERT_TRUE(on);
  auto c = on->Client();
  const std::vector<int> doc = TokenRun(0, 201), other = TokenRun(3, 150);
  auto ask = [&](int q) {
    std::vector<int> prompt = doc;
    for (int t : TokenRun(100 + 31 * q, 20)) prompt.push_back(t);
    auto [st, a] = PostJson(*c, "/completion", {{"prompt", prompt}, {"n_predict", 2}, {"temperature", 0}});
    EXPECT_EQ(st, 200) << a.dump();
    return a.value("tokens_cached", size_t{0});
  };
  ask(0);
  EXPECT_EQ(ask(1), doc.size()) << "the lane is cut back to the document";
  auto [st, b] = PostJson(*c, "/completion", {{"prompt", other}, {"n_predict", 2}, {"temperature", 0}});
  ASSERT_EQ(st, 200) << b.dump();
  EXPECT_EQ(ask(2), doc.size()) << "the third question should restore the document from the recorded cut";
}

// A burst of requests sharing a long prefix, sent at once to a cold server: one lane prefills the
// prefix, the others wait for its first token and restore the prefix (scheduler SharedPrefill rule),
// instead of each prefilling it again, taking turns one lane at a time or with --lane-batching, for
// a dense family and a hybrid one (whose lane in flight adds a record where the prefix ends,
// LaneCache::RecordAlso). Every answer's tokens and log-probabilities equal a --no-cache server's.
void ExpectABurstPrefillsASharedPrefixOnce(const std::string& family, const std::vector<std::string>& flags) {
  SCOPED_TRACE(family);
  std::vector<std::string> common = {"-c", "2048", "--runtime-lane-count", "3", "--prefill-chunk", "32",
                                     "--cache-record-stride", "64", "--cache-grid-budget", "0"};
  common.insert(common.end(), flags.begin(), flags.end());
  std::vector<std::string> off_flags = common;
  off_flags.push_back("--no-cache");
  auto on = ServerProcess::Start(family, common, family + "-burst-on");
  auto off = ServerProcess::Start(family, off_flags, family + "-burst-off");
  ASSERT_TRUE(on && off);
  if (std::find(flags.begin(), flags.end(), "--lane-batching") != flags.end()) {
    const json stats = json::parse(on->Client()->Get("/cache/stats")->body);
    ASSERT_TRUE(stats["lane_batching"].value("on", false)) << stats["lane_batching"].dump();
  }
  auto waits = [&] { return json::parse(on->Client()->Get("/cache/stats")->body).value("shared_prefill_waits", 0); };
  size_t waited = 0;
  for (int attempt = 0; attempt < 5 && waits() == 0; ++attempt) {
    // A new prefix each attempt, so the burst finds nothing cached.
    const std::vector<int> prefix = TokenRun(1 + 1000 * attempt, 640);
    std::vector<std::vector<int>> prompts;
    for (int q = 0; q < 3; ++q) {
      prompts.push_back(prefix);
      for (int t : TokenRun(300 + 37 * q + 1000 * attempt, 20)) prompts.back().push_back(t);
    }
    json got[3];
    std::vector<std::thread> burst;
    for (int q = 0; q < 3; ++q) burst.emplace_back([&, q] { got[q] = AskTokens(*on, prompts[q], 8); });
    for (std::thread& t : burst) t.join();
    for (int q = 0; q < 3; ++q) {
      const json ref = AskTokens(*off, prompts[q], 8);
      EXPECT_EQ(got[q]["tokens"], ref["tokens"]) << "request " << q;
      EXPECT_EQ(got[q]["completion_probabilities"], ref["completion_probabilities"]) << "request " << q;
      if (got[q]["skippy"].value("prefix_wait_ms", 0.0) > 0) {
        ++waited;
        EXPECT_EQ(got[q]["timings"].value("cache_n", size_t{0}), prefix.size())
            << "waited, then did not restore the shared prefix: " << got[q]["skippy"].dump();
      }
    }
  }
  EXPECT_GT(waits(), 0) << "no request of a burst waited for another's prefill";
  EXPECT_GT(waited, 0u);
}

TEST(SharedPrefill, ABurstPrefillsASharedPrefixOnce) {
  ExpectABurstPrefillsASharedPrefixOnce("llama", {"--lane-batching=off"});
}

TEST(SharedPrefill, ABurstPrefillsASharedPrefixOnceWithLanesTogether) {
  ExpectABurstPrefillsASharedPrefixOnce("llama", {"--lane-batching"});
}

TEST(SharedPrefill, AHybridBurstPrefillsASharedPrefixOnce) {
  ExpectABurstPrefillsASharedPrefixOnce("qwen3next", {"--lane-batching=off"});
}

TEST(SharedPrefill, AHybridBurstPrefillsASharedPrefixOnceWithLanesTogether) {
  ExpectABurstPrefillsASharedPrefixOnce("qwen3next", {"--lane-batching"});
}

// --exact-min-batch is only a claim: the startup batch-split check proves it or the cache is off.
// With flash attention on over the stock kernels, 2-row batches take another kernel path than
// 64-row ones (tests/runtime BatchSplitCheck), so this server must refuse the cache and still serve.
TEST(ExactMinBatch, AWrongClaimTurnsTheCacheOff) {
  auto on = ServerProcess::Start("llama", {"-c", "512", "-fa", "on", "--exact-min-batch", "2", "--no-batch-invariant"},
                                 "llama-min-batch-2");
  ASSERT_TRUE(on);
  auto c = on->Client();
  auto stats = c->Get("/cache/stats");
  ASSERT_TRUE(stats);
  const json j = json::parse(stats->body);
  EXPECT_FALSE(j.value("enabled", true)) << j.dump();
  EXPECT_NE(j.value("disabled_reason", std::string()), "") << j.dump();
  EXPECT_FALSE(j["batch_split"].value("pass", true)) << j.dump();
  const std::vector<int> prompt = TokenRun(0, 150);
  for (int i = 0; i < 2; ++i) {
    auto [st, a] = PostJson(*c, "/completion", {{"prompt", prompt}, {"n_predict", 2}, {"temperature", 0}});
    ASSERT_EQ(st, 200) << a.dump();
    EXPECT_EQ(a.value("tokens_cached", -1), 0) << "served from a cache that failed its check";
  }
}

// Q4_K_M on llama.cpp's stock kernels: repacked products give a row other bits in other batch
// sizes, the startup check fails, and the server serves every request recomputed, saying why.
// --tpot-slo-ms cuts no prefill batch there either: a cut would make an answer depend on the lanes
// decoding beside it, cache or not.
TEST(BatchInvariant, StockKernelsTurnTheCacheOffOnQ4KM) {
  auto on = ServerProcess::Start("llama.Q4_K_M", {"-c", "512", "--no-batch-invariant", "--tpot-slo-ms", "0.001"},
                                 "llama-q4km-stock");
  auto off = ServerProcess::Start("llama.Q4_K_M", {"-c", "512", "--no-batch-invariant", "--tpot-slo-ms", "0.001",
                                                   "--no-cache"}, "llama-q4km-stock-off");
  ASSERT_TRUE(on && off);
  auto c = on->Client();
  const json j = json::parse(c->Get("/cache/stats")->body);
  EXPECT_FALSE(j.value("batch_invariant", true)) << j.dump();
  EXPECT_FALSE(j.value("enabled", true)) << j.dump();
  EXPECT_NE(j.value("disabled_reason", std::string()).find("batch-split"), std::string::npos) << j.dump();
  for (ServerProcess* server : {on.get(), off.get()}) {
    const json slo = json::parse(server->Client()->Get("/cache/stats")->body)["slo"];
    EXPECT_NE(slo.value("cuts_off_reason", std::string()).find("batch-split"), std::string::npos) << slo.dump();
  }
  const std::vector<int> prompt = TokenRun(0, 150);
  for (int i = 0; i < 2; ++i) {
    auto [st, a] = PostJson(*c, "/completion", {{"prompt", prompt}, {"n_predict", 2}, {"temperature", 0}});
    ASSERT_EQ(st, 200) << a.dump();
    EXPECT_EQ(a.value("tokens_cached", -1), 0) << "served from a cache that failed its check";
  }
}

}  // namespace
