// server::MeasureLoneStep on a real engine (tiny zoo): what the scheduler relies on when it runs
// the measure on the lanes it is about to serve from.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/server/decode_groups.h"
#include "test_env.h"

namespace skippy {
namespace {

namespace env = testing_env;

// The one-row class is process-wide: every test leaves it as it found it, whatever fails.
class LoneStep : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!runtime::BatchInvariant() || !runtime::OneRowClassAvailable()) GTEST_SKIP() << "no one-row class here";
    class_before_ = runtime::OneRowClass();
  }
  void TearDown() override { runtime::SetOneRowClass(class_before_); }

  static std::unique_ptr<runtime::Engine> OpenTwoLanes(const std::string& family) {
    auto e = runtime::Engine::Open(env::ServerLayout(family, /*flash_attn=*/true, /*lanes=*/2, /*n_ctx=*/1024));
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  bool class_before_ = false;
};

class LoneStepFamilies : public LoneStep, public ::testing::WithParamInterface<const char*> {};

// Whichever class it finds, the measure leaves it so; it leaves lane 0 empty (the scheduler serves
// from it next: a prompt there from position 0 gets the bits it gets in a lane the measure never
// touched) and the other lanes as they were (their next token's bits are those of lane 0 after the
// same prompt). A dense and a hybrid family: a hybrid lane also holds recurrent state.
TEST_P(LoneStepFamilies, LeavesTheClassAndTheLanesAsItFoundThem) {
  auto e = OpenTwoLanes(GetParam());
  ASSERT_NE(e, nullptr);
  const auto prompt = env::Tokens(*e, 40);
  ASSERT_EQ(prompt.size(), 40u);
  const std::vector<runtime::Token> next = {prompt[3]};
  for (const bool was : {false, true}) {
    SCOPED_TRACE(was ? "class on" : "class off");
    ASSERT_TRUE(runtime::SetOneRowClass(was));
    ASSERT_TRUE(e->Clear(0).ok());
    ASSERT_TRUE(e->Clear(1).ok());
    auto beside = e->Decode(1, prompt, 0);
    ASSERT_TRUE(beside.ok()) << beside.status();

    auto cost = server::MeasureLoneStep(*e, /*max_context=*/128, /*fill_budget_ms=*/60000, /*pairs=*/2);
    ASSERT_TRUE(cost.ok()) << cost.status();
    EXPECT_EQ(runtime::OneRowClass(), was);
    EXPECT_EQ(e->SequenceLength(0), 0);
    EXPECT_EQ(e->SequenceLength(1), 40);
    EXPECT_EQ(cost->context, 128u);  // the fill budget is a minute: the whole context is filled
    EXPECT_EQ(cost->pairs, 2u);
    EXPECT_GT(cost->class_ms, 0);
    EXPECT_GT(cost->default_ms, 0);
    EXPECT_GT(cost->ratio, 0);

    auto lane0 = e->Decode(0, prompt, 0);
    ASSERT_TRUE(lane0.ok()) << lane0.status();
    EXPECT_TRUE(env::SameBytes(*lane0, *beside)) << "lane 0 is not empty after the measure";
    auto next0 = e->Decode(0, next, 40);
    auto next1 = e->Decode(1, next, 40);
    ASSERT_TRUE(next0.ok()) << next0.status();
    ASSERT_TRUE(next1.ok()) << next1.status();
    EXPECT_TRUE(env::SameBytes(*next0, *next1)) << "the measure changed lane 1";
  }
}

INSTANTIATE_TEST_SUITE_P(DenseAndHybrid, LoneStepFamilies, ::testing::Values("llama", "qwen3next"),
                         [](const auto& info) { return std::string(info.param); });

// A lane too small for the steps asked for is refused before anything is touched.
TEST_F(LoneStep, RefusesALaneTooSmallAndTouchesNothing) {
  auto e = OpenTwoLanes("llama");
  ASSERT_NE(e, nullptr);
  const auto prompt = env::Tokens(*e, 40);
  ASSERT_TRUE(e->Prefill(0, prompt, 0).ok());
  const size_t too_many_pairs = static_cast<size_t>(e->LaneCapacity());
  auto cost = server::MeasureLoneStep(*e, /*max_context=*/128, /*fill_budget_ms=*/1000, too_many_pairs);
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kFailedPrecondition) << cost.status();
  EXPECT_EQ(e->SequenceLength(0), 40);
  EXPECT_EQ(runtime::OneRowClass(), class_before_);
}

}  // namespace
}  // namespace skippy
