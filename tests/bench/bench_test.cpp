// skippy-bench: the production runner end to end on tiny models with a real llama-server, the
// report renderer on fixed inputs, and the bad inputs the runner must survive.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "skippy/bench/fleet.h"
#include "skippy/bench/production.h"
#include "skippy/bench/report.h"
#include "skippy/bench/serve_compare.h"
#include "skippy/bench/use_case_corpus.h"
#include "skippy/bench/workloads.h"
#include "skippy/common/strings.h"

namespace {

using nlohmann::json;
using skippy::StrCat;
namespace fs = std::filesystem;
namespace bench = skippy::bench;

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / StrCat("skippy-bench-test-", getpid(), "-",
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  bench::ProductionOptions Options() const {
    bench::ProductionOptions o;
    o.output_dir = (dir_ / "out").string();
    o.zoo_dir = SKIPPY_TEST_ZOO_DIR;
    o.zoo_preset = "tiny";
    o.correctness_bin = StrCat(SKIPPY_TEST_BIN_DIR, "/skippy-correctness");
    o.llama_server_bin = StrCat(SKIPPY_TEST_BIN_DIR, "/llama-server");
    o.use_case_corpus = SKIPPY_TEST_CORPUS;
    o.cache_hit_repeats = 2;
    o.llama_repeats = 3;
    o.ctx_size = 512;
    o.threads = 1;  // ctest runs a test per core
    return o;
  }

  std::string FakeServer(const std::string& body) const {
    const fs::path p = dir_ / "fake-llama-server.sh";
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    chmod(p.c_str(), 0755);
    return p.string();
  }

  fs::path dir_;
};

TEST_F(BenchTest, RunnerMeasuresADenseAndAHybridFamilyAgainstLlamaServer) {
  auto o = Options();
  o.cases = {"llama", "qwen3next"};
  auto doc = bench::RunProduction(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ((*doc)["rows"].size(), 2u);
  for (const json& r : (*doc)["rows"]) {
    EXPECT_EQ(r["status"], "ok") << r.dump(2);
    EXPECT_EQ(r["correctness"], "pass");
    EXPECT_EQ(r["llama_server"]["runs"].size(), 3u);
    EXPECT_GT(r["llama_server"]["warm_median_ms"].get<double>(), 0.0);
    EXPECT_GT(r["speedup"].get<double>(), 0.0);
    EXPECT_EQ(r["benchmark_prompt_token_count"], 129);
    EXPECT_EQ(r["skippy"]["mode"], "state-handoff");
    // The warm runs reuse llama-server's prompt cache.
    EXPECT_GT(r["llama_server"]["runs"][2]["timings"].value("cache_n", 0), 0) << r["llama_server"].dump();
  }
  EXPECT_EQ((*doc)["rows"][0]["payload"], "resident-kv");
  EXPECT_EQ((*doc)["rows"][1]["payload"], "kv-recurrent");
  // Written to disk, well-formed, with the markdown beside it.
  std::ifstream in(fs::path(o.output_dir) / "production-cache-bench.json");
  json on_disk = json::parse(in);
  EXPECT_EQ(on_disk["rows"].size(), 2u);
  EXPECT_TRUE(fs::exists(fs::path(o.output_dir) / "production-cache-bench.md"));
}

// Rounds: both sides measured in each, a row's numbers the medians of the rounds' medians.
TEST_F(BenchTest, RoundsTakeTurnsAndARowIsTheMedianOfTheirMedians) {
  auto o = Options();
  o.cases = {"llama"};
  o.rounds = 3;
  auto doc = bench::RunProduction(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ((*doc)["rows"].size(), 1u);
  const json& r = (*doc)["rows"][0];
  EXPECT_EQ(r["status"], "ok") << r.dump(2);
  EXPECT_EQ(r["rounds"], 3);
  EXPECT_EQ(r["settings"]["rounds"], 3);
  const json& runs = r["llama_server"]["runs"];
  ASSERT_EQ(runs.size(), 9u);
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i]["round"], static_cast<int>(i / 3)) << runs.dump();
  auto median_of = [](const json& v) {
    std::vector<double> x = v.get<std::vector<double>>();
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  const json& skippy = r["skippy_hit_round_medians_ms"];
  const json& llama = r["llama_server"]["round_medians_ms"];
  ASSERT_EQ(skippy.size(), 3u);
  ASSERT_EQ(llama.size(), 3u);
  EXPECT_DOUBLE_EQ(r["skippy_hit_median_ms"].get<double>(), median_of(skippy));
  EXPECT_DOUBLE_EQ(r["llama_server_warm_median_ms"].get<double>(), median_of(llama));
  EXPECT_DOUBLE_EQ(r["speedup"].get<double>(), median_of(llama) / median_of(skippy));
  // Every round certified: each left its report in the work directory.
  for (const char* tag : {"llama-p128.certify.json", "llama-p128-r1.certify.json", "llama-p128-r2.certify.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(o.output_dir) / "work" / tag)) << tag;
  }
}

TEST_F(BenchTest, UseCaseRowsCarryTheirSource) {
  auto o = Options();
  o.cases = {"olmo"};
  o.use_case = "text_to_sql";
  o.skip_llama_server = true;
  auto doc = bench::RunProduction(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ((*doc)["rows"].size(), 1u);
  const json& r = (*doc)["rows"][0];
  EXPECT_EQ(r["use_case"], "text_to_sql");
  EXPECT_EQ(r["use_case_source"]["dataset"], "gretelai/synthetic_text_to_sql");
  EXPECT_EQ(r["status"], "skippy-only");
}

TEST_F(BenchTest, LlamaServerThatNeverBecomesHealthyIsARowErrorAndTheRunContinues) {
  auto o = Options();
  o.cases = {"llama", "olmo"};
  o.server_startup_timeout_secs = 2;
  o.llama_server_bin = FakeServer("sleep 30");
  auto doc = bench::RunProduction(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ((*doc)["rows"].size(), 2u);
  for (const json& r : (*doc)["rows"]) {
    EXPECT_EQ(r["correctness"], "pass");
    EXPECT_EQ(r["status"], "llama-server-error");
    EXPECT_NE(r["llama_server"]["error"].get<std::string>().find("healthy"), std::string::npos) << r.dump();
  }
}

TEST_F(BenchTest, LlamaServerThatExitsEarlyIsReportedWithItsLog) {
  auto o = Options();
  o.cases = {"llama"};
  o.llama_server_bin = FakeServer("echo 'error: model is broken' >&2; exit 3");
  auto doc = bench::RunProduction(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const json& r = (*doc)["rows"][0];
  EXPECT_EQ(r["status"], "llama-server-error");
  const std::string err = r["llama_server"]["error"];
  EXPECT_NE(err.find("exited early"), std::string::npos) << err;
  EXPECT_NE(err.find("model is broken"), std::string::npos) << err;
}

TEST_F(BenchTest, MissingModelAndFailedCertificationAreRowsNotCrashes) {
  auto o = Options();
  o.cases = {"llama"};
  o.zoo_dir = (dir_ / "empty-zoo").string();
  auto doc = bench::RunProduction(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)["rows"][0]["status"], "missing");
}

TEST_F(BenchTest, UnknownCaseAndBadOptionsAreErrors) {
  auto o = Options();
  o.cases = {"not-a-family"};
  EXPECT_EQ(bench::RunProduction(o).status().code(), absl::StatusCode::kNotFound);
  o = Options();
  o.use_case = "not-a-use-case";
  EXPECT_EQ(bench::RunProduction(o).status().code(), absl::StatusCode::kNotFound);
  o = Options();
  o.prefix_tokens = {4096};
  EXPECT_EQ(bench::RunProduction(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.rounds = 0;
  EXPECT_EQ(bench::RunProduction(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UseCaseCorpus, TheShippedCorpusHasTheEightUseCasesOfTheSpec) {
  auto corpus = bench::LoadUseCaseCorpus(SKIPPY_TEST_CORPUS);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  std::vector<std::string> keys;
  for (const auto& u : *corpus) keys.push_back(u.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"tool_calling", "text_to_sql", "coding_agent_loop", "issue_fixing",
                                            "code_refinement", "few_shot_reasoning", "open_chat", "summarization_rag"}));
}

TEST(UseCaseCorpus, AMissingKeyIsNamedInTheError) {
  const std::string doc = R"({"version": 1, "use_cases": [{"key": "a", "label": "A", "prefix_tokens": 128,
      "source": {"dataset": "d", "config": "c", "split": "s"}, "prompt": "p"}]})";
  auto c = bench::ParseUseCaseCorpus(doc);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("row_idx"), std::string_view::npos) << c.status();
  EXPECT_FALSE(bench::ParseUseCaseCorpus("{not json").ok());
  EXPECT_FALSE(bench::ParseUseCaseCorpus(R"({"version": 1})").ok());
}

json Row(const std::string& key, const std::string& family, double speedup, const std::string& status = "ok") {
  return {{"key", key}, {"family", family}, {"model_ref", "org/model|Q4"}, {"payload", "resident-kv"},
          {"prefix_tokens", 128}, {"benchmark_prompt_token_count", 129}, {"correctness", status == "ok" ? "pass" : "mismatch"},
          {"status", status}, {"speedup", speedup}, {"llama_server_warm_median_ms", 10.0},
          {"skippy_hit_median_ms", 10.0 / speedup}, {"cache_bytes", 1024}, {"cache_bytes_method", "measured"},
          {"notes", json::array({"a|b"})}};
}

TEST(Report, FamilyOrderEscapingMissingCellsAndFailedFamilies) {
  json full = {{"synthetic_weights", true}, {"zoo_preset", "bench"}, {"rows", json::array()}};
  // Out of order on purpose: the report restores the family-table order.
  full["rows"].push_back(Row("gemma2", "Gemma2", 1.5));
  full["rows"].push_back(Row("qwen3next", "Qwen3Next", 9.0));
  full["rows"].push_back(Row("llama", "Llama", 2.0, "mismatch"));
  json uses = {{"rows", json::array()}, {"use_cases", json::array({{{"key", "open_chat"}, {"label", "Open chat"},
                                                                    {"prefix_tokens", 128},
                                                                    {"source", {{"dataset", "x"}, {"row_idx", 0}}}}})}};
  json u1 = Row("qwen3next", "Qwen3Next", 8.0);
  u1["use_case"] = "open_chat";
  json u2 = Row("gemma2", "Gemma2", 1.1);
  u2["use_case"] = "open_chat";
  uses["rows"].push_back(u1);
  uses["rows"].push_back(u2);
  json u3 = Row("olmo", "OLMo", 1.3, "llama-server-error");
  u3["use_case"] = "open_chat";
  uses["rows"].push_back(u3);
  const std::string md = bench::RenderReport({full, uses}, {});
  EXPECT_NE(md.find("Synthetic weights"), std::string::npos);
  const size_t q = md.find("| Qwen3Next |"), g = md.find("| Gemma2 |");
  ASSERT_NE(q, std::string::npos);
  ASSERT_NE(g, std::string::npos);
  EXPECT_LT(q, g) << "rows must follow the family order";
  EXPECT_NE(md.find("org/model\\|Q4"), std::string::npos) << "a '|' inside a cell must be escaped";
  EXPECT_EQ(md.find("| Llama | org"), std::string::npos) << "a failed family must not be promoted";
  EXPECT_NE(md.find("- Llama (prefix 128): mismatch"), std::string::npos) << md;
  EXPECT_NE(md.find("| Use case | Qwen3Next | Gemma2 | OLMo |"), std::string::npos) << md;
  EXPECT_NE(md.find("| Open chat | 8.00x | 1.10x | - |"), std::string::npos) << md;
}

// A package-only row that did not pass shows its reason and no numbers; the header says what a hit
// timed when the run stored the continuation's logits.
TEST(Report, PackageOnlyRowsThatFailedShowNoNumbersAndTheHitIsNamed) {
  json doc = {{"synthetic_weights", true}, {"settings", {{"cache_decoded_result_hits", true}}}, {"rows", json::array()}};
  json passed = Row("minimax", "MiniMax", 2.0);
  passed["package_only"] = true;
  passed["skippy"] = {{"recompute_total_ms", 30.0}, {"cache_hit_total_ms", 99.0}};
  json failed = Row("deepseek3", "DeepSeek3", 4.0, "mismatch");
  failed["package_only"] = true;
  failed["skippy"] = {{"recompute_total_ms", 40.0}, {"cache_hit_total_ms", 1.0}, {"cache_hit_speedup", 40.0}};
  doc["rows"] = {passed, failed};
  const std::string md = bench::RenderReport({doc}, {});
  // The hit is the median of rounds (skippy_hit_median_ms 5.0), not the first round's certification.
  EXPECT_NE(md.find("| MiniMax | org/model\\|Q4 | resident-kv | pass | 128 | 30.00 | 5.00 | 6.00x | 10.00 | 1024 |"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| DeepSeek3 | org/model\\|Q4 | resident-kv | mismatch | 128 | - | - | - | - | - |"), std::string::npos)
      << md;
  EXPECT_EQ(md.find("40.00x"), std::string::npos) << md;
  EXPECT_NE(md.find("copy of the continuation's stored logits (no decode)"), std::string::npos) << md;
}

// One report has one header: inputs measured with other settings, or synthetic beside real weights,
// are refused.
TEST(Report, InputsWithOtherSettingsOrWeightsAreRefused) {
  const fs::path dir = fs::temp_directory_path() / StrCat("skippy-report-mix-", ::getpid());
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const json& doc) {
    std::ofstream((dir / name).string()) << doc.dump();
    return (dir / name).string();
  };
  const json base = {{"synthetic_weights", true}, {"settings", {{"threads", 2}, {"zoo_preset", "bench"}}},
                     {"rows", json::array({Row("llama", "Llama", 2.0)})}};
  json other_preset = base;
  other_preset["settings"]["zoo_preset"] = "tiny";
  json other_threads = base;
  other_threads["settings"]["threads"] = 4;
  json real = base;
  real["synthetic_weights"] = false;
  bench::ReportOptions o;
  o.charts = false;
  o.output = (dir / "out.md").string();
  o.inputs = {write("a.json", base), write("b.json", other_preset)};
  EXPECT_TRUE(bench::WriteReport(o).ok());
  o.inputs = {write("a.json", base), write("c.json", other_threads)};
  auto threads = bench::WriteReport(o);
  EXPECT_EQ(threads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(threads.status().message().find("threads"), std::string_view::npos) << threads.status();
  o.inputs = {write("a.json", base), write("d.json", real)};
  EXPECT_EQ(bench::WriteReport(o).status().code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(Workloads, AreDeterministicPerSeedAndShapedAsNamed) {
  bench::WorkloadOptions o;
  o.long_prefix_words = 60;
  for (const std::string& name : bench::WorkloadNames()) {
    auto a = bench::MakeWorkload(name, o), b = bench::MakeWorkload(name, o);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    ASSERT_FALSE(a->requests.empty()) << name;
    ASSERT_EQ(a->requests.size(), b->requests.size());
    for (size_t i = 0; i < a->requests.size(); ++i) EXPECT_EQ(a->requests[i].prompt, b->requests[i].prompt) << name;
    auto other = o;
    other.seed = 2;
    auto c = bench::MakeWorkload(name, other);
    ASSERT_TRUE(c.ok());
    EXPECT_NE(a->requests[0].prompt, c->requests[0].prompt) << name << ": the seed must matter";
  }
  // Shapes: repeats repeat, shared prefixes share, interleaving revisits, transcripts grow.
  auto repeat = *bench::MakeWorkload("exact-repeat", o);
  EXPECT_EQ(repeat.requests.front().prompt, repeat.requests.back().prompt);
  auto shared = *bench::MakeWorkload("shared-prefix", o);
  const std::string& s0 = shared.requests[0].prompt;
  const std::string& s1 = shared.requests[1].prompt;
  EXPECT_NE(s0, s1);
  EXPECT_EQ(s0.substr(0, s0.find("User:")), s1.substr(0, s1.find("User:")));
  auto inter = *bench::MakeWorkload("interleaved-prefixes", o);
  EXPECT_EQ(inter.requests.size(), static_cast<size_t>(o.documents * o.rounds));
  EXPECT_EQ(inter.requests[0].stream, inter.requests[static_cast<size_t>(o.documents)].stream);
  auto agent = *bench::MakeWorkload("agent-loop", o);
  for (size_t i = 1; i < agent.requests.size(); ++i) {
    const std::string& prev = agent.requests[i - 1].prompt;
    EXPECT_EQ(agent.requests[i].prompt.compare(0, prev.size() - 15, prev, 0, prev.size() - 15), 0) << "transcript must grow";
  }
  // long-answers: two long answers on one system prompt, then a cold document with a short one.
  auto answers = *bench::MakeWorkload("long-answers", o);
  ASSERT_EQ(answers.requests.size(), static_cast<size_t>(3 * o.documents));
  const auto& a = answers.requests;
  EXPECT_EQ(a[0].n_predict, o.answer_tokens);
  EXPECT_EQ(a[1].n_predict, o.answer_tokens);
  EXPECT_EQ(a[2].n_predict, o.n_predict);
  EXPECT_EQ(a[0].prompt.substr(0, a[0].prompt.find("User:")), a[4].prompt.substr(0, a[4].prompt.find("User:")));
  EXPECT_NE(a[2].prompt.substr(a[2].prompt.find(':'), 60), a[5].prompt.substr(a[5].prompt.find(':'), 60)) << "each document is cold";
  EXPECT_EQ(bench::MakeWorkload("nope", o).status().code(), absl::StatusCode::kNotFound);
  o.answer_tokens = 0;
  EXPECT_EQ(bench::MakeWorkload("long-answers", o).status().code(), absl::StatusCode::kInvalidArgument);
  o.answer_tokens = 128;
  o.documents = 0;
  EXPECT_EQ(bench::MakeWorkload("interleaved-prefixes", o).status().code(), absl::StatusCode::kInvalidArgument);
}

// chat-replies: a later turn is sent as its stream's last prompt, the server's reply to it and the
// new user turn; the first turn of each conversation stands alone.
TEST(Workloads, ChatRepliesCarryEachReplyIntoTheNextTurn) {
  bench::WorkloadOptions o;
  o.long_prefix_words = 40;
  o.conversations = 2;
  o.turns = 2;
  auto w = bench::MakeWorkload("chat-replies", o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->has_replies());
  ASSERT_EQ(w->requests.size(), 4u);
  const auto& r = w->requests;
  EXPECT_FALSE(r[0].after_reply);
  EXPECT_FALSE(r[1].after_reply);
  EXPECT_TRUE(r[2].after_reply);
  EXPECT_EQ(r[2].stream, r[0].stream);
  EXPECT_EQ(r[3].stream, r[1].stream);
  bench::ReplyChain chain;
  const std::string p0 = chain.PromptFor(r[0]), p1 = chain.PromptFor(r[1]);
  EXPECT_EQ(p0, r[0].prompt);
  chain.Answered(r[0], p0, " first reply.");
  chain.Answered(r[1], p1, " second reply.");
  EXPECT_EQ(chain.PromptFor(r[2]), p0 + " first reply." + r[2].prompt);
  EXPECT_EQ(chain.PromptFor(r[3]), p1 + " second reply." + r[3].prompt);
  EXPECT_FALSE(bench::MakeWorkload("multi-turn", o)->has_replies());
}

TEST_F(BenchTest, ServeCompareRunsEveryWorkloadAgainstBothServers) {
  bench::ServeCompareOptions o;
  o.output_dir = (dir_ / "sc").string();
  o.cases = {"llama"};
  o.servers = {"skippy", "llama-matched"};
  o.zoo_dir = SKIPPY_TEST_ZOO_DIR;
  o.skippy_server_bin = StrCat(SKIPPY_TEST_BIN_DIR, "/skippy-server");
  o.llama_server_bin = StrCat(SKIPPY_TEST_BIN_DIR, "/llama-server");
  o.threads = 1;
  o.ctx_size = 1024;
  o.repeats = 1;
  o.concurrency_sweep = {2};
  o.workload.long_prefix_words = 60;
  o.workload.requests = 3;
  o.workload.documents = 3;
  o.workload.rounds = 2;
  o.workload.conversations = 2;
  o.workload.turns = 2;
  o.workload.agent_steps = 2;
  o.workload.n_predict = 4;
  o.workload.answer_tokens = 8;
  auto doc = bench::RunServeCompare(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ((*doc)["runs"].size(), bench::WorkloadNames().size() * 2);
  for (const json& run : (*doc)["runs"]) {
    ASSERT_EQ(run["status"], "ok") << run.dump();
    EXPECT_EQ(run["summary"]["ok_requests"], run["summary"]["requests"]) << run["workload"] << " " << run["server"];
    EXPECT_GT(run["summary"]["peak_rss_bytes"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ((*doc)["summary"].size(), bench::WorkloadNames().size() * 2);
  // The restart workload: skippy-server's restarted process reuses every document from its disk
  // tier; llama-server's reuses no more than the "Document " its documents start with.
  for (const json& run : (*doc)["runs"]) {
    if (run["workload"] != "restart") continue;
    ASSERT_TRUE(run["phases"].contains("after-restart")) << run.dump();
    for (const json& r : run["requests"]) {
      if (r["phase"] != "after-restart") continue;
      if (run["server"] == "skippy") {
        EXPECT_GT(r["cache_n"].get<int>(), 60) << r.dump();
      } else {
        EXPECT_LT(r["cache_n"].get<int>(), 10) << r.dump();
      }
    }
  }
  ASSERT_EQ((*doc)["concurrency_sweep"].size(), 2u);
  for (const json& l : (*doc)["concurrency_sweep"]) {
    EXPECT_EQ(l["status"], "ok") << l.dump();
    // Each request's timeline: which of the two clients sent it, when, and the server's timings.
    ASSERT_EQ(l["requests"].size(), l["summary"]["requests"].get<size_t>()) << l.dump();
    for (const json& r : l["requests"]) {
      EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
      EXPECT_GE(r["client"].get<int>(), 0);
      EXPECT_LT(r["client"].get<int>(), 2);
      EXPECT_GE(r["sent_ms"].get<double>(), 0.0);
      EXPECT_GE(r["e2e_ms"].get<double>(), r["ttft_ms"].get<double>());
      // The longest wait between two tokens lies within the stream after the first; there is none
      // with one token.
      if (r["tokens"].get<int>() > 1) {
        EXPECT_GT(r["max_gap_ms"].get<double>(), 0.0) << r.dump();
        EXPECT_LE(r["max_gap_ms"].get<double>(), r["e2e_ms"].get<double>() - r["ttft_ms"].get<double>()) << r.dump();
      } else {
        EXPECT_EQ(r["max_gap_ms"].get<double>(), 0.0) << r.dump();
      }
      EXPECT_TRUE(r["timings"].contains("cache_n")) << r.dump();
    }
  }
  std::ifstream in(fs::path(o.output_dir) / "serve-compare.json");
  EXPECT_EQ(json::parse(in)["runs"].size(), (*doc)["runs"].size());
  EXPECT_TRUE(fs::exists(fs::path(o.output_dir) / "serve-compare.md"));
}

// A model file that is not there (a format spelt in lower case, say) fails before any server
// starts, and says what it looked for.
TEST_F(BenchTest, ServeCompareChecksEveryModelFirst) {
  bench::ServeCompareOptions o;
  o.output_dir = (dir_ / "sc-missing").string();
  o.cases = {"llama", "gemma3"};
  o.zoo_dir = SKIPPY_TEST_ZOO_DIR;
  o.zoo_format = "q4_k_m";
  auto doc = bench::RunServeCompare(o);
  ASSERT_EQ(doc.status().code(), absl::StatusCode::kNotFound) << doc.status();
  EXPECT_NE(doc.status().message().find("llama.q4_k_m.gguf"), std::string::npos) << doc.status();
  EXPECT_FALSE(fs::exists(fs::path(o.output_dir) / "serve-compare.json"));
}

// The fleet benchmark end to end on the tiny zoo: both fleets answer every request, every Skippy
// answer equals the single server's, the restarted replica hits from the shared tier, and the
// fault run (Redis and a replica killed) leaves no request unanswered or wrong.
TEST_F(BenchTest, FleetRunsBothFleetsTheRestartAndTheFaults) {
  bench::FleetOptions o;
  o.output_dir = (dir_ / "fleet").string();
  o.workloads = {"interleaved-prefixes"};
  o.zoo_dir = SKIPPY_TEST_ZOO_DIR;
  o.skippy_server_bin = StrCat(SKIPPY_TEST_BIN_DIR, "/skippy-server");
  o.skippy_router_bin = StrCat(SKIPPY_TEST_BIN_DIR, "/skippy-router");
  o.llama_server_bin = StrCat(SKIPPY_TEST_BIN_DIR, "/llama-server");
  o.replicas = 2;
  o.ctx_size = 1024;
  o.workload.long_prefix_words = 80;
  o.workload.documents = 3;
  o.workload.rounds = 2;
  o.workload.n_predict = 4;
  auto doc = bench::RunFleet(o);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ((*doc)["workloads"].size(), 1u);
  const json& w = (*doc)["workloads"][0];
  EXPECT_EQ(w["skippy"]["errors"], 0) << w["skippy"].dump();
  EXPECT_EQ(w["skippy"]["differs_from_reference"], 0);
  EXPECT_EQ(w["skippy"]["requests"], 6);
  EXPECT_EQ(w["llama"]["requests"], 6);
  EXPECT_GT(w["skippy"]["reused_tokens"].get<int>(), 0);
  EXPECT_EQ((*doc)["restart"]["shared_hits"], 3) << (*doc)["restart"].dump();
  const json& f = (*doc)["faults"];
  // A replica killed in a prefill is retried elsewhere; a stream it had begun answering cannot
  // move (its tokens are out) and must end with the router's error, never silently. Only the
  // other client's request can be on the victim when it dies.
  int cut = 0;
  for (const json& r : f["results"]) {
    if (r["ok"].get<bool>()) continue;
    ++cut;
    EXPECT_EQ(r["error"], "the replica serving this stream failed") << f.dump();
  }
  EXPECT_LE(cut, 1) << f.dump();
  EXPECT_EQ(f["answered"].get<int>() + cut, f["requests"].get<int>()) << f.dump();
  EXPECT_EQ(f["router"]["streams_cut"].get<int>(), cut) << f.dump();
  EXPECT_EQ(f["wrong"], 0);
  EXPECT_TRUE(fs::exists(fs::path(o.output_dir) / "fleet.md"));
}

TEST(ServeCompareRender, HeadToHeadRowsFromTheJsonAndClearErrors) {
  const fs::path dir = fs::temp_directory_path() / StrCat("skippy-sc-render-", ::getpid());
  fs::create_directories(dir);
  EXPECT_EQ(bench::RenderServeCompare(dir.string()).code(), absl::StatusCode::kNotFound);
  std::ofstream(dir / "serve-compare.json") << "{\"runs\": []}";
  EXPECT_EQ(bench::RenderServeCompare(dir.string()).code(), absl::StatusCode::kInvalidArgument);
  auto row = [](const char* server, double p50, int reused) {
    return json{{"family", "llama"}, {"workload", "shared-prefix"}, {"server", server}, {"ttft_p50_ms", p50},
                {"prompt_tokens_reused", reused}};
  };
  json doc = {{"synthetic_weights", true}, {"settings", {{"ttft_slo_ms", 500}}}, {"concurrency_sweep", json::array()},
              {"summary", {row("skippy", 20.0, 900), row("llama-default", 40.0, 800), row("llama-matched", 50.0, 0),
                           // a workload without all three servers gets no head-to-head row
                           json{{"family", "llama"}, {"workload", "agent-loop"}, {"server", "skippy"}, {"ttft_p50_ms", 9.0}}}}};
  // A sweep level: TPOT and the longest stall beside throughput; streams that ended in an error event
  // are counted apart.
  doc["concurrency_sweep"].push_back({{"family", "llama"}, {"server", "llama-default"}, {"concurrency", 4},
                                      {"workload", "long-answers"},
                                      {"summary", {{"ttft_p50_ms", 100.0}, {"ttft_p95_ms", 300.0}, {"tpot_p50_ms", 40.0},
                                                   {"tpot_p95_ms", 50.0}, {"max_gap_p95_ms", 600.0}, {"throughput_rps", 0.5},
                                                   {"generated_tokens_per_s", 40.0}, {"goodput_rps", 0.25},
                                                   {"slo_attainment", 0.5}, {"errors", 3}, {"unanswered", 1}}},
                                      {"status", "failed"}, {"error", "1 of 12 requests got no answer"}});
  // A run in which a request got no answer is in no median: the failed-runs table says why.
  doc["runs"] = {{{"family", "llama"}, {"workload", "shared-prefix"}, {"server", "skippy"}, {"repeat", 1},
                  {"status", "failed"}, {"error", "1 of 6 requests got no answer; the first: connection refused"}},
                 {{"family", "llama"}, {"workload", "shared-prefix"}, {"server", "skippy"}, {"repeat", 0}, {"status", "ok"}}};
  doc["summary"][0]["agreement"] = "3/6";
  doc["summary"][0]["disagreements"] = {{{"near_tie", true}}, {{"near_tie", false}}, {{"withheld_tail", true}}};
  std::ofstream(dir / "serve-compare.json") << doc.dump();
  ASSERT_TRUE(bench::RenderServeCompare(dir.string()).ok());
  std::ifstream in(dir / "serve-compare.md");
  const std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("| llama | shared-prefix | 20.0 | 40.0 | 50.0 | 2.00x | 900 / 800 | 3/6 (1 same tokens as far as llama-server "
                    "sent them, 1 of 2 near-ties) |"), std::string::npos) << md;
  EXPECT_EQ(md.find("| llama | agent-loop | 9.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| llama | 4 | llama-default | 100.0 | 300.0 | 40.0 | 50.0 | 600.0 | 0.50 | 40.0 | 0.25 | 50% | 3 / 1 |"),
            std::string::npos) << md;
  EXPECT_NE(md.find("## Failed runs"), std::string::npos) << md;
  EXPECT_NE(md.find("| llama | shared-prefix repeat 2 | skippy | failed | 1 of 6 requests got no answer; the first: "
                    "connection refused |"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| llama | 4 clients | llama-default | failed | 1 of 12 requests got no answer |"), std::string::npos) << md;
  EXPECT_EQ(md.find("repeat 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("Synthetic-weight"), std::string::npos);
  fs::remove_all(dir);
}

// A request that got no answer has no latency: it is counted apart, not as a 0 ms TTFT, and lowers
// throughput, goodput and SLO attainment.
TEST(ServeCompareSummary, AnUnansweredRequestHasNoLatencyAndIsCountedApart) {
  auto answered = [](double ttft, int tokens) {
    bench::StreamRun r;
    r.ok = true;
    r.ttft_ms = ttft;
    r.total_ms = ttft + 10.0 * (tokens - 1);
    r.tokens = tokens;
    r.tpot_ms = 10.0;
    return r;
  };
  bench::StreamRun unanswered;
  unanswered.error = "connection refused";
  bench::StreamRun cut = answered(30.0, 3);
  cut.error = "stream ended with an error event";
  const json s = bench::SummarizeStreamRuns({answered(100.0, 4), unanswered, answered(200.0, 4), cut}, 2.0, 150.0, 0.0);
  EXPECT_EQ(s["requests"], 4);
  EXPECT_EQ(s["ok_requests"], 3);
  EXPECT_EQ(s["unanswered"], 1);
  EXPECT_EQ(s["errors"], 1);
  EXPECT_DOUBLE_EQ(s["ttft_p50_ms"].get<double>(), 100.0);  // of 30, 100, 200: no 0 for the unanswered one
  EXPECT_DOUBLE_EQ(s["throughput_rps"].get<double>(), 1.0);  // two served in 2 s
  EXPECT_DOUBLE_EQ(s["goodput_rps"].get<double>(), 0.5);     // 100 ms only: 200 is past the SLO, 30 was cut
  EXPECT_DOUBLE_EQ(s["slo_attainment"].get<double>(), 0.25);
  const json none = bench::SummarizeStreamRuns({unanswered}, 1.0, 150.0, 0.0);
  EXPECT_EQ(none["unanswered"], 1);
  EXPECT_EQ(none["ok_requests"], 0);
}

// Where two greedy completions part and how close each server's logits were there.
TEST(ServeCompareDivergence, FindsThePositionAndBothGaps) {
  auto tok = [](int id, double lp, std::vector<std::pair<int, double>> top) {
    json t = json::array();
    for (auto [i, l] : top) t.push_back({{"id", i}, {"logprob", l}});
    return json{{"id", id}, {"logprob", lp}, {"top_logprobs", t}};
  };
  const json same = tok(7, -0.1, {{7, -0.1}, {8, -3.0}});
  // A near-tie: at position 1, a chose 5 over 6 by 0.02 nats, b chose 6 over 5 by 0.03.
  json a = {same, tok(5, -0.70, {{5, -0.70}, {6, -0.72}})};
  json b = {same, tok(6, -0.69, {{6, -0.69}, {5, -0.72}}), tok(9, -0.1, {{9, -0.1}})};
  json d = bench::DivergenceOf(a, b);
  EXPECT_EQ(d["position"], 1);
  EXPECT_EQ(d["a"]["token"], 5);
  EXPECT_NEAR(d["a"]["gap"].get<double>(), 0.02, 1e-9);
  EXPECT_NEAR(d["b"]["gap"].get<double>(), 0.03, 1e-9);
  EXPECT_TRUE(d["near_tie"]);
  // A clear preference on one side is not a near-tie.
  b[1] = tok(6, -0.1, {{6, -0.1}, {5, -2.5}});
  EXPECT_FALSE(bench::DivergenceOf(a, b)["near_tie"]);
  // The other side's token outside this side's top list: gap unknown, no near-tie claimed.
  b[1] = tok(6, -0.69, {{6, -0.69}, {5, -0.72}});
  a[1] = tok(5, -0.70, {{5, -0.70}, {4, -0.9}});
  d = bench::DivergenceOf(a, b);
  EXPECT_TRUE(d["a"]["gap"].is_null());
  EXPECT_FALSE(d["near_tie"]);
  // One side stopped (its list ends) where the other went on.
  d = bench::DivergenceOf(json::array({same}), json::array({same, tok(9, -0.1, {{9, -0.1}})}));
  EXPECT_EQ(d["position"], 1);
  EXPECT_TRUE(d["a"].is_null());
  EXPECT_EQ(d["b"]["token"], 9);
  EXPECT_FALSE(d["near_tie"]);
  EXPECT_EQ(bench::DivergenceOf(json::array({same}), json::array({same}))["position"], -1);
  EXPECT_EQ(bench::DivergenceOf(json::array(), json::array())["position"], -1);
}

TEST(BenchCli, BadArgumentsExitWithCodeTwo) {
  const std::string bin = StrCat(SKIPPY_TEST_BIN_DIR, "/skippy-bench");
  auto rc = [&](const std::string& args) { return WEXITSTATUS(std::system((bin + " " + args + " >/dev/null 2>&1").c_str())); };
  EXPECT_EQ(2, rc("production"));
  EXPECT_EQ(2, rc("production --output-dir /tmp/skippy-x --case nope"));
  EXPECT_EQ(2, rc("production --output-dir /tmp/skippy-x --prefix-token-sweep 128,abc"));
  EXPECT_EQ(2, rc("report --input /nonexistent.json --output /tmp/skippy-x.md"));
  // Refused before anything runs: a format no zoo writes, no threads, no warm llama-server request,
  // a sweep level out of range.
  EXPECT_EQ(2, rc("production --output-dir /tmp/skippy-x --zoo-format Q4_K_X"));
  EXPECT_EQ(2, rc("serve-compare --output-dir /tmp/skippy-x --zoo-format f17"));
  EXPECT_EQ(2, rc("production --output-dir /tmp/skippy-x --threads 0"));
  EXPECT_EQ(2, rc("production --output-dir /tmp/skippy-x --llama-repeats 1"));
  EXPECT_EQ(2, rc("production --output-dir /tmp/skippy-x --concurrency-sweep 1,99"));
  EXPECT_EQ(2, rc("serve-compare --output-dir /tmp/skippy-x --concurrency-sweep 1,32"));
}

}  // namespace
