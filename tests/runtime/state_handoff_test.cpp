// The certifier end to end on the tiny zoo: every family passes bit-exact with its production
// payload, the policy refuses KV-only reuse of hybrids and kv-recurrent for dense families, and bad
// input is a clear error with a distinct exit code.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "skippy/certify/state_handoff.h"
#include "skippy/runtime/synthetic_model.h"
#include "skippy/zoo/zoo_spec.h"
#include "test_env.h"

namespace {

using skippy::StrCat;
using skippy::cache::PayloadKind;
using skippy::certify::RunStateHandoff;
using skippy::certify::StateHandoffOptions;
using skippy::certify::Verdict;
namespace env = skippy::testing_env;
namespace fs = std::filesystem;

StateHandoffOptions Options(std::string_view family) {
  StateHandoffOptions o;
  o.model_path = env::ZooFile(family);
  o.prompt = env::kPrompt;
  o.prefix_token_count = 128;
  o.cache_hit_repeats = 3;
  o.ctx_size = 512;
  o.threads = env::Threads();
  return o;
}

std::vector<std::string> FamilyKeys() {
  std::vector<std::string> keys;
  for (const auto& f : skippy::zoo::Families()) keys.emplace_back(f.key);
  return keys;
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n) if (c == '-') c = '_';
  return n;
}

class CertifyFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(CertifyFamily, ProductionPayloadRestoresBitExact) {
  auto result = RunStateHandoff(Options(GetParam()));
  ASSERT_TRUE(result.ok()) << result.status();
  const auto& r = result->report;
  EXPECT_EQ(result->verdict, Verdict::kPass) << r.dump(2);
  EXPECT_EQ(r["status"], "pass");
  EXPECT_TRUE(r["predicted_token_matches"].get<bool>());
  EXPECT_TRUE(r["restored_output_matches"].get<bool>());
  EXPECT_TRUE(r["suffix_prefill_matches"].get<bool>());
  EXPECT_TRUE(r["cache_hit_matches"].get<bool>());
  EXPECT_EQ(r["benchmark_prompt_token_count"], 129);
  EXPECT_EQ(r["cache_hit_import_ms"].size(), 3u);
  EXPECT_GT(r["state_bytes"].get<uint64_t>(), 0u);
  auto family = skippy::zoo::FindFamily(GetParam());
  ASSERT_TRUE(family.ok());
  EXPECT_EQ(r["state_payload_kind"], std::string(skippy::cache::PayloadKindName((*family)->row().payload)));
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, CertifyFamily, ::testing::ValuesIn(FamilyKeys()), TestName);

TEST(CertifyPolicy, DenseFamilyAskedForKvRecurrentIsRefused) {
  auto o = Options("llama");
  o.payload = PayloadKind::kKvRecurrent;
  auto result = RunStateHandoff(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->verdict, Verdict::kDisabled);
  EXPECT_EQ(result->report["status"], "disabled");
}

TEST(CertifyPolicy, HybridFamilyAskedForResidentKvIsRefused) {
  for (const char* family : {"qwen3next", "falcon-h1"}) {
    auto o = Options(family);
    o.payload = PayloadKind::kResidentKv;
    auto result = RunStateHandoff(o);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->verdict, Verdict::kDisabled) << family;
    EXPECT_NE(result->report["reason"].get<std::string>().find("resident-kv"), std::string::npos)
        << result->report["reason"];
  }
}

TEST(CertifyPolicy, AnArchitectureOutsideTheTableIsCertifiedLikeAnyOther) {
  // qwen2 runs in llama.cpp but is not a row of the family table: the policy learns a dense
  // payload from its memory, and this run is what certifies it.
  skippy::zoo::FamilySpec spec = *skippy::zoo::FindFamily("qwen3").value();
  spec.arch_override = "qwen2";
  const std::string path = (fs::temp_directory_path() / StrCat("skippy-qwen2-", getpid(), ".gguf")).string();
  auto written = skippy::runtime::WriteSyntheticModel(spec, skippy::zoo::Preset::kTiny, env::VocabDir(), path);
  ASSERT_TRUE(written.ok()) << written.status();
  auto o = Options("qwen3");
  o.model_path = path;
  auto result = RunStateHandoff(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->verdict, Verdict::kPass) << result->report.dump().substr(0, 1500);
  EXPECT_TRUE(result->report["family"]["learned"].get<bool>());
  EXPECT_FALSE(result->report["family"]["enabled"].get<bool>()) << "enabled before the run, by the run only";
  EXPECT_EQ(result->report["family"]["key"], "qwen2");
  EXPECT_EQ(result->report["state_payload_kind"], "resident-kv");
  // A recurrent payload is still refused for it, as for a dense table family.
  o.payload = PayloadKind::kKvRecurrent;
  auto refused = RunStateHandoff(o);
  fs::remove(path);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->verdict, Verdict::kDisabled);
}

TEST(CertifyRestore, RestoreIntoTheSameLaneAndManyHitsInARow) {
  for (const char* family : {"llama", "qwen3next", "gemma3"}) {
    auto o = Options(family);
    o.lane_count = 1;
    o.cache_hit_repeats = 20;
    auto result = RunStateHandoff(o);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->verdict, Verdict::kPass) << family;
    EXPECT_EQ(result->report["cache_hit_decode_ms"].size(), 20u);
  }
}

TEST(CertifyRestore, BorrowedAndDecodedResultHitsStayExact) {
  auto o = Options("qwen3");
  o.borrow_resident_hits = true;
  o.cache_hit_repeats = 5;
  auto borrowed = RunStateHandoff(o);
  ASSERT_TRUE(borrowed.ok()) << borrowed.status();
  EXPECT_EQ(borrowed->verdict, Verdict::kPass);
  o.borrow_resident_hits = false;
  o.cache_decoded_result_hits = true;
  auto decoded = RunStateHandoff(o);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->verdict, Verdict::kPass);
}

TEST(CertifyRestore, FullStateDiagnosticIsExactOnADenseFamily) {
  auto o = Options("llama");
  o.payload = PayloadKind::kFullState;
  auto result = RunStateHandoff(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->verdict, Verdict::kPass);
  EXPECT_TRUE(result->report["diagnostic_payload"].get<bool>());
  EXPECT_GT(result->report["payload_digest"]["blocks"].size(), 0u);
}

TEST(CertifyBadInput, EmptyPromptIsInvalidArgument) {
  auto o = Options("llama");
  o.prompt = "";
  EXPECT_EQ(RunStateHandoff(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CertifyBadInput, PromptLongerThanTheContextIsInvalidArgument) {
  auto o = Options("llama");
  o.ctx_size = 256;
  o.prefix_token_count = 1000;
  auto result = RunStateHandoff(o);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("longer than the context"), std::string_view::npos) << result.status();
}

TEST(CertifyBadInput, TruncatedModelIsDataLoss) {
  std::ifstream in(env::ZooFile("llama"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = (fs::temp_directory_path() / StrCat("skippy-trunc-", getpid(), ".gguf")).string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 3));
  auto o = Options("llama");
  o.model_path = path;
  auto result = RunStateHandoff(o);
  fs::remove(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
}

TEST(CertifyBadInput, PartialLayerRangeIsUnimplemented) {
  auto o = Options("llama");
  o.state_layer_start = 1;
  EXPECT_EQ(RunStateHandoff(o).status().code(), absl::StatusCode::kUnimplemented);
  // A range that ends before the model's last layer is refused too, not run on the whole model and
  // reported as that range.
  auto whole = RunStateHandoff(Options("llama"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  const int32_t n_layer = whole->report["model_identity"]["layer_end"].get<int32_t>();
  ASSERT_GE(n_layer, 2);
  o = Options("llama");
  o.layer_end = n_layer - 1;
  EXPECT_EQ(RunStateHandoff(o).status().code(), absl::StatusCode::kUnimplemented);
  o.layer_end = n_layer;
  o.state_layer_end = n_layer - 1;
  EXPECT_EQ(RunStateHandoff(o).status().code(), absl::StatusCode::kUnimplemented);
  o.state_layer_end = n_layer;
  auto named = RunStateHandoff(o);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->verdict, Verdict::kPass);
}

// ggml sizes its threadpool from the thread count: 0 or a negative count must not reach it.
TEST(CertifyBadInput, AThreadCountBelowOneIsInvalidArgument) {
  for (int threads : {0, -3}) {
    auto o = Options("llama");
    o.threads = threads;
    EXPECT_EQ(RunStateHandoff(o).status().code(), absl::StatusCode::kInvalidArgument) << threads;
  }
}

int RunCli(const std::string& args) {
  const int rc = std::system(StrCat(env::CorrectnessBin(), " state-handoff --threads ", env::Threads(), " ", args, " >/dev/null 2>&1").c_str());
  return WEXITSTATUS(rc);
}

TEST(CertifyCli, ExitCodesDistinguishPassDisabledAndBadInput) {
  const std::string model = "--model " + env::ZooFile("llama") + " --cache-hit-repeats 1 ";
  EXPECT_EQ(0, RunCli(model + "--prompt hello"));
  EXPECT_EQ(3, RunCli(model + "--prompt hello --state-payload-kind kv-recurrent"));
  EXPECT_EQ(2, RunCli(model + "--prompt ''"));
  EXPECT_EQ(2, RunCli(model + "--prompt hello --state-payload-kind bogus"));
  EXPECT_EQ(2, RunCli(model + "--prompt hello --ctx-size 256 --prefix-token-count 1000"));
  EXPECT_EQ(2, RunCli("--model /nonexistent.gguf --prompt hello"));
  EXPECT_EQ(2, RunCli("--prompt hello"));  // --model is required
  const int zero_threads = std::system(StrCat(env::CorrectnessBin(), " state-handoff --threads 0 ", model,
                                              "--prompt hello >/dev/null 2>&1").c_str());
  EXPECT_EQ(2, WEXITSTATUS(zero_threads));
}

}  // namespace
