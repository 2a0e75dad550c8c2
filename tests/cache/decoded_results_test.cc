#include "skippy/cache/decoded_results.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace skippy::cache {
namespace {

using testing::MakeScope;
using testing::Seq;

TEST(DecodedResults, ExactRepeatReturnsStoredLogits) {
  DecodedResultCache c;
  auto s = MakeScope("", 4);
  ASSERT_TRUE(c.Put(s, Seq({1, 2, 3}), {0.1f, 0.2f, 0.3f, 0.4f}).ok());
  auto r = c.Get(s, Seq({1, 2, 3}));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->logits, std::vector<float>({0.1f, 0.2f, 0.3f, 0.4f}));
  EXPECT_EQ(c.Get(s, Seq({1, 2})), nullptr);        // a prefix is not a repeat
  EXPECT_EQ(c.Get(s, Seq({1, 2, 3, 0})), nullptr);  // nor an extension
  EXPECT_EQ(c.Get(MakeScope("other", 4), Seq({1, 2, 3})), nullptr);
  EXPECT_EQ(c.Stats().hits, 1u);
  EXPECT_EQ(c.Stats().misses, 3u);
}

TEST(DecodedResults, LogitsMustMatchVocabulary) {
  DecodedResultCache c;
  auto s = MakeScope("", 4);
  EXPECT_EQ(c.Put(s, Seq({1}), {0.f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Put(s, {}, {0.f, 0.f, 0.f, 0.f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Stats().entries, 0u);
}

TEST(DecodedResults, BoundedByBytesLeastRecentlyUsedFirst) {
  DecodedResultCache c({10, 3 * (4 * 4 + 4)});
  auto s = MakeScope("", 4);
  std::vector<float> l(4, 1.f);
  ASSERT_TRUE(c.Put(s, Seq({1}), l).ok());
  ASSERT_TRUE(c.Put(s, Seq({2}), l).ok());
  ASSERT_TRUE(c.Put(s, Seq({3}), l).ok());
  ASSERT_NE(c.Get(s, Seq({1})), nullptr);
  ASSERT_TRUE(c.Put(s, Seq({0}), l).ok());
  EXPECT_EQ(c.Get(s, Seq({2})), nullptr);
  EXPECT_NE(c.Get(s, Seq({1})), nullptr);
  EXPECT_EQ(c.Stats().evictions, 1u);
  EXPECT_LE(c.Stats().bytes, 60u);
}

TEST(DecodedResults, ResultLargerThanWholeCapIsRefused) {
  DecodedResultCache c({10, 8});
  auto s = MakeScope("", 4);
  EXPECT_EQ(c.Put(s, Seq({1}), std::vector<float>(4)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DecodedResults, ResultOutlivesEviction) {
  DecodedResultCache c({1, 1 << 20});
  auto s = MakeScope("", 4);
  ASSERT_TRUE(c.Put(s, Seq({1}), std::vector<float>(4, 2.f)).ok());
  auto held = c.Get(s, Seq({1}));
  ASSERT_TRUE(c.Put(s, Seq({2}), std::vector<float>(4, 3.f)).ok());
  EXPECT_EQ(c.Get(s, Seq({1})), nullptr);
  EXPECT_EQ(held->logits[0], 2.f);
}

}  // namespace
}  // namespace skippy::cache
