// The one-row class of the patch series (runtime::OneRowClass, patches/llama.cpp): a row computed
// alone gets the bits it gets in any batch. So the batch-split check passes with batches of one
// row on dense, sliding-window, MLA and hybrid families, flash attention on and off, F16 and
// quantized; lanes step together in one llama_decode without pad rows, hybrids included; and a
// generated token's KV is the KV the same token gets as a prompt row. Each test switches the
// class on before its first model (the switch is process-wide; ctest runs every test in a process
// of its own).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "skippy/certify/batch_split.h"
#include "skippy/certify/lane_batching.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"
#include "test_env.h"

namespace {

using skippy::StrCat;
using skippy::runtime::Engine;
using skippy::runtime::Token;
namespace env = skippy::testing_env;

// Before any model: the class is read when llama.cpp plans a graph.
bool SwitchOn() { return skippy::runtime::SetOneRowClass(true) && skippy::runtime::OneRowClass(); }
#define REQUIRE_ONE_ROW_CLASS() \
  if (!SwitchOn()) GTEST_SKIP() << "this llama.cpp build has no one-row class (built without the patch series)"

std::unique_ptr<Engine> Open(const std::string& path_or_family, bool flash_attn, uint32_t lanes) {
  return env::OpenServerLayout(path_or_family, flash_attn, lanes);
}

void ExpectBatchSplitPassesWithOneRowBatches(const std::string& model) {
  for (bool fa : {false, true}) {
    auto e = Open(model, fa, 1);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->MinExactBatch(), 1u);
    auto r = skippy::certify::CheckBatchSplits(*e, 0, e->MinExactBatch());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->pass) << model << " flash_attn=" << fa << ": " << r->ToJson().dump();
    const bool has_one = std::any_of(r->cuts.begin(), r->cuts.end(), [](const std::vector<size_t>& c) {
      return std::find(c.begin(), c.end(), size_t{1}) != c.end();
    });
    EXPECT_TRUE(has_one) << "no cut has a one-row batch: " << r->ToJson().dump();
  }
}

TEST(OneRowClass, EveryBatchSizeIsOneClass) {
  REQUIRE_ONE_ROW_CLASS();
  for (const char* family : {"llama", "gemma3", "deepseek2", "qwen3next"}) ExpectBatchSplitPassesWithOneRowBatches(family);
}

TEST(OneRowClass, EveryBatchSizeIsOneClassOnQuantizedWeights) {
  REQUIRE_ONE_ROW_CLASS();
  // Q4_K: repacked, a lone row on the GEMM-order GEMV (patch 0006); Q8_0: its dot product matches
  // tinyBLAS; IQ2_XS: the panel.
  for (const char* model : {"llama.Q4_K_M", "llama.IQ2_XS", "gemma3.Q8_0", "deepseek2.Q4_K_M", "qwen3next.Q4_K_M"}) {
    ExpectBatchSplitPassesWithOneRowBatches(StrCat(SKIPPY_TEST_SMALL_ZOO_DIR, "/", model, ".gguf"));
  }
}

// A lane's decode step: the same logits alone, beside another lane (the check), and as Decode;
// and the generated token's KV equals the KV that token gets as a row of a prompt batch (what a
// next turn that restores the exchange relies on).
TEST(OneRowClass, AGeneratedTokenIsComputedAsAPromptRow) {
  REQUIRE_ONE_ROW_CLASS();
  for (const char* family : {"llama", "qwen3next"}) {
    SCOPED_TRACE(family);
    auto e = Open(family, /*flash_attn=*/true, 2);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->CanDecodeSteps()) << "no pad row to drop: hybrids step together too";
    auto check = skippy::certify::CheckLaneBatching(*e, 0, 1);
    ASSERT_TRUE(check.ok()) << check.status();
    EXPECT_TRUE(check->pass) << check->ToJson().dump();

    const auto tokens = env::Tokens(*e, 200);
    const std::span<const Token> prompt = std::span(tokens).first(150);
    const Token t = tokens[150], u = tokens[151];
    // Generated: prompt in one batch, then t and u one row each (DecodeStep and Decode).
    ASSERT_TRUE(e->Clear(0).ok());
    ASSERT_TRUE(e->Prefill(0, prompt, 0).ok());
    Engine::DecodeStepIn in{0, t, 150};
    auto after_t = e->DecodeStep(std::span(&in, 1));
    ASSERT_TRUE(after_t.ok()) << after_t.status();
    EXPECT_EQ(e->SequenceLength(0), 151) << "no pad row left behind";
    auto generated = e->Decode(0, std::span(&u, 1), 151);
    ASSERT_TRUE(generated.ok()) << generated.status();
    // As a prompt: prompt + t in one batch (t's logits are its last row's), then u.
    std::vector<Token> longer(prompt.begin(), prompt.end());
    longer.push_back(t);
    ASSERT_TRUE(e->Clear(1).ok());
    auto prompt_t = e->Decode(1, longer, 0);
    ASSERT_TRUE(prompt_t.ok()) << prompt_t.status();
    EXPECT_TRUE(env::SameBytes((*after_t)[0], *prompt_t)) << "a decode step and a prompt's last row differ";
    auto as_prompt = e->Decode(1, std::span(&u, 1), 151);
    ASSERT_TRUE(as_prompt.ok()) << as_prompt.status();
    EXPECT_TRUE(env::SameBytes(*generated, *as_prompt)) << "the generated token's KV is not the prompt row's";
  }
}

}  // namespace
