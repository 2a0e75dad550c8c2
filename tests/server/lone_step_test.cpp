// server::MeasureLoneStep on a real engine (tiny zoo): what the scheduler relies on when it runs
// the measure on the lanes it is about to serve from.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "skippy/runtime/engine.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/server/decode_groups.h"
#include "test_env.h"

namespace skippy {
namespace {

namespace env = testing_env;

std::unique_ptr<runtime::Engine> OpenTwoLanes() {
  auto e = runtime::Engine::Open(env::ServerLayout("llama", /*flash_attn=*/true, /*lanes=*/2, /*n_ctx=*/1024));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// Whichever class it finds, the measure leaves it so, leaves lane 0 empty (the scheduler serves
// from it next: a prompt there from position 0 gets the bits it gets in a lane the measure never
// touched), and leaves the other lanes alone.
TEST(MeasureLoneStep, LeavesTheClassAndTheLanesAsItFoundThem) {
  if (!runtime::BatchInvariant() || !runtime::OneRowClassAvailable()) GTEST_SKIP() << "no one-row class here";
  auto e = OpenTwoLanes();
  ASSERT_NE(e, nullptr);
  const auto prompt = env::Tokens(*e, 40);
  ASSERT_EQ(prompt.size(), 40u);
  for (const bool was : {false, true}) {
    SCOPED_TRACE(was ? "class on" : "class off");
    ASSERT_EQ(runtime::SetOneRowClass(was), true);
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
    EXPECT_TRUE(env::SameBytes(*lane0, *beside));
    ASSERT_TRUE(e->Clear(0).ok());
  }
  runtime::SetOneRowClass(false);
}

// A lane too small for the steps asked for is refused before anything is touched.
TEST(MeasureLoneStep, RefusesALaneTooSmallAndTouchesNothing) {
  if (!runtime::BatchInvariant() || !runtime::OneRowClassAvailable()) GTEST_SKIP() << "no one-row class here";
  auto e = OpenTwoLanes();
  ASSERT_NE(e, nullptr);
  const auto prompt = env::Tokens(*e, 40);
  ASSERT_TRUE(e->Prefill(0, prompt, 0).ok());
  const size_t too_many_pairs = static_cast<size_t>(e->LaneCapacity());
  auto cost = server::MeasureLoneStep(*e, /*max_context=*/128, /*fill_budget_ms=*/1000, too_many_pairs);
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kFailedPrecondition) << cost.status();
  EXPECT_EQ(e->SequenceLength(0), 40);
  EXPECT_FALSE(runtime::OneRowClass());
}

}  // namespace
}  // namespace skippy
