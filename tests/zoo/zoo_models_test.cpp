// Every tiny zoo model is a working model of its family: it loads, says it is synthetic, decodes a
// fixed token sequence to finite, non-degenerate logits, decodes identically twice, and round-trips
// text through its tokenizer. Generation is byte-deterministic. Bad model files are refused with a
// clear Status, not an abort.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "skippy/common/strings.h"
#include "skippy/runtime/model.h"
#include "skippy/runtime/synthetic_model.h"
#include "skippy/zoo/zoo_spec.h"

namespace fs = std::filesystem;
using skippy::runtime::Context;
using skippy::runtime::ContextOptions;
using skippy::runtime::Model;
using skippy::runtime::Token;
using skippy::StrCat;

namespace {

// Paths come from the build (compile definitions); the environment may override them.
std::string Env(const char* name) {
  if (const char* v = std::getenv(name)) return v;
  const std::string n = name;
  if (n == "SKIPPY_ZOO_DIR") return SKIPPY_TEST_ZOO_DIR;
  if (n == "SKIPPY_LLAMA_SERVER") return SKIPPY_TEST_LLAMA_SERVER;
  if (n == "SKIPPY_ZOO_BIN") return SKIPPY_TEST_ZOO_BIN;
  if (n == "SKIPPY_VOCAB_DIR") return SKIPPY_TEST_VOCAB_DIR;
  return "";
}

std::string ZooFile(std::string_view key) { return StrCat(Env("SKIPPY_ZOO_DIR"), "/", key, ".gguf"); }

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> FamilyKeys() {
  std::vector<std::string> keys;
  for (const auto& f : skippy::zoo::Families()) keys.emplace_back(f.key);
  return keys;
}

class ZooFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooFamily, LoadsAndIsLabelledSynthetic) {
  auto family = skippy::zoo::FindFamily(GetParam());
  ASSERT_TRUE(family.ok());
  auto model = Model::Load(ZooFile(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->arch(), (*family)->arch());
  EXPECT_EQ((*model)->MetaString("skippy.synthetic").value_or(""), "true");
  EXPECT_EQ((*model)->MetaString("skippy.zoo.family").value_or(""), GetParam());
  EXPECT_GT((*model)->n_vocab(), 1000);
}

TEST_P(ZooFamily, DecodingTwiceGivesIdenticalLogits) {
  auto model = Model::Load(ZooFile(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<Token> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 7919 + 13) % (*model)->n_vocab());

  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    ContextOptions opts;
    opts.n_ctx = 256;
    opts.n_threads = 1;  // ctest runs a test per core: one thread each
    opts.n_batch = 16;  // several chunks: exercises cache reuse across ubatches
    opts.n_ubatch = 16;
    auto ctx = Context::Create(**model, opts);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    auto logits = (*ctx)->Decode(tokens, 0);
    ASSERT_TRUE(logits.ok()) << logits.status();
    runs.push_back(std::move(*logits));
  }
  ASSERT_EQ(runs[0].size(), static_cast<size_t>((*model)->n_vocab()));
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)))
      << "logits differ between two identical decodes";
  float lo = runs[0][0], hi = runs[0][0];
  for (float v : runs[0]) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GT(hi - lo, 1e-3f) << "degenerate model: all logits equal";
}

TEST_P(ZooFamily, TokenizerRoundTripsText) {
  auto model = Model::Load(ZooFile(GetParam()));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string text = "Hello world! The quick brown fox jumps over the lazy dog: 12345.";
  auto tokens = (*model)->Tokenize(text, /*add_special=*/false);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_FALSE(tokens->empty());
  auto back = (*model)->Detokenize(*tokens);
  ASSERT_TRUE(back.ok()) << back.status();
  // Some tokenizers add a leading space (SentencePiece style); the text itself must survive.
  EXPECT_NE(back->find(text), std::string::npos) << "round trip gave: '" << *back << "'";
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, ZooFamily, ::testing::ValuesIn(FamilyKeys()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) if (c == '-') c = '_';
                           return n;
                         });

TEST(ZooGenerator, SameSeedAndPresetGiveByteIdenticalFiles) {
  auto family = skippy::zoo::FindFamily("llama");
  ASSERT_TRUE(family.ok());
  const fs::path dir = fs::temp_directory_path() / StrCat("skippy-zoo-determinism-", getpid());
  fs::create_directories(dir);
  const std::string a = (dir / "a.gguf").string(), b = (dir / "b.gguf").string();
  auto ia = skippy::runtime::WriteSyntheticModel(**family, skippy::zoo::Preset::kTiny, Env("SKIPPY_VOCAB_DIR"), a);
  auto ib = skippy::runtime::WriteSyntheticModel(**family, skippy::zoo::Preset::kTiny, Env("SKIPPY_VOCAB_DIR"), b);
  ASSERT_TRUE(ia.ok()) << ia.status();
  ASSERT_TRUE(ib.ok()) << ib.status();
  EXPECT_EQ(ia->spec_digest, ib->spec_digest);
  const auto bytes_a = ReadAll(a);
  EXPECT_TRUE(bytes_a == ReadAll(b));
  // ... and identical to the file the zoo fixture wrote in another process.
  EXPECT_TRUE(bytes_a == ReadAll(ZooFile("llama")));
  fs::remove_all(dir);
}

TEST(ZooGenerator, EveryZooRowIsARowOfTheFamilyTableInTheSameOrder) {
  const auto zoo = skippy::zoo::Families();
  const auto table = skippy::cache::KnownFamilies();
  ASSERT_EQ(zoo.size(), table.size());
  for (size_t i = 0; i < zoo.size(); ++i) {
    EXPECT_EQ(zoo[i].key, table[i].key);
    EXPECT_EQ(&zoo[i].row(), &table[i]);
  }
}

TEST(ZooGenerator, UnknownFamilyAndPresetAreClearErrors) {
  auto f = skippy::zoo::FindFamily("not-a-family");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("llama"), std::string_view::npos) << "error should list known keys";
  EXPECT_FALSE(skippy::zoo::ParsePreset("huge").ok());
  auto olmo = skippy::zoo::FindFamily("olmo");
  ASSERT_TRUE(olmo.ok());
  EXPECT_EQ(skippy::zoo::DimsFor(**olmo, skippy::zoo::Preset::kReal).status().code(), absl::StatusCode::kNotFound);
}

TEST(ZooCli, BadArgumentsExitWithCodeTwo) {
  const std::string zoo = Env("SKIPPY_ZOO_BIN");
  EXPECT_EQ(2, WEXITSTATUS(std::system((zoo + " --preset tiny --out /tmp/x --family nope >/dev/null 2>&1").c_str())));
  EXPECT_EQ(2, WEXITSTATUS(std::system((zoo + " --preset huge --out /tmp/x >/dev/null 2>&1").c_str())));
  EXPECT_EQ(2, WEXITSTATUS(std::system((zoo + " --preset tiny >/dev/null 2>&1").c_str())));
  EXPECT_EQ(0, WEXITSTATUS(std::system((zoo + " --list >/dev/null 2>&1").c_str())));
}

class BadModelFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / StrCat("skippy-badmodel-", getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(BadModelFile, TruncatedGgufIsDataLoss) {
  const auto bytes = ReadAll(ZooFile("llama"));
  ASSERT_GT(bytes.size(), 1000u);
  const std::string path = (dir_ / "truncated.gguf").string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  auto model = Model::Load(path);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  EXPECT_NE(model.status().message().find("truncated"), std::string_view::npos) << model.status();
}

TEST_F(BadModelFile, HeaderOnlyGgufIsDataLoss) {
  const auto bytes = ReadAll(ZooFile("llama"));
  const std::string path = (dir_ / "header.gguf").string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), 64);
  auto model = Model::Load(path);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
}

TEST_F(BadModelFile, NonGgufFileIsInvalidArgument) {
  const std::string path = (dir_ / "notes.gguf").string();
  std::ofstream(path) << "this is not a model\n";
  auto model = Model::Load(path);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_NE(model.status().message().find("not a GGUF"), std::string_view::npos);
}

TEST_F(BadModelFile, MissingFileIsNotFound) {
  auto model = Model::Load((dir_ / "absent.gguf").string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelInput, OutOfVocabularyTokensAndOverlongPromptsAreRefused) {
  auto model = Model::Load(ZooFile("llama"));
  ASSERT_TRUE(model.ok()) << model.status();
  ContextOptions opts;
  opts.n_ctx = 64;
  opts.n_threads = 1;
  auto ctx = Context::Create(**model, opts);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  std::vector<Token> bad = {1, 2, (*model)->n_vocab()};
  EXPECT_EQ((*ctx)->Decode(bad, 0).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<Token> negative = {-1};
  EXPECT_EQ((*ctx)->Decode(negative, 0).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<Token> too_long((*ctx)->options().n_ctx + 1, 1);
  EXPECT_EQ((*ctx)->Decode(too_long, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ctx)->Decode({}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  // The context is still usable afterwards.
  std::vector<Token> ok = {1, 2, 3};
  EXPECT_TRUE((*ctx)->Decode(ok, 0).ok());
}

}  // namespace
