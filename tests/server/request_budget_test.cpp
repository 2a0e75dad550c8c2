// CheckBudget: a request without max_tokens generates until the end of the sequence or of the
// context (llama-server's -n -1), within --max-tokens-limit and -n; an explicit max_tokens that
// does not fit is a 400, as OpenAI answers it.
#include <gtest/gtest.h>

#include "skippy/server/request.h"

namespace skippy::server {
namespace {

TEST(RequestBudget, WithoutMaxTokensTheAnswerMayTakeWhatTheContextLeaves) {
  Budget b;
  b.context = 2048;
  EXPECT_EQ(*CheckBudget(b, 100, -1), 1948);
  EXPECT_EQ(*CheckBudget(b, 2048, -1), 0);
  b.max_tokens_limit = 64;
  EXPECT_EQ(*CheckBudget(b, 100, -1), 64);
  b.max_tokens_limit = 0;
  b.default_max_tokens = 256;  // -n 256
  EXPECT_EQ(*CheckBudget(b, 100, -1), 256);
  EXPECT_EQ(*CheckBudget(b, 2000, -1), 48);
}

TEST(RequestBudget, AnExplicitLengthThatDoesNotFitIsRefused) {
  Budget b;
  b.context = 2048;
  EXPECT_EQ(*CheckBudget(b, 100, 1948), 1948);
  EXPECT_EQ(CheckBudget(b, 100, 1949).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckBudget(b, 100, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckBudget(b, 2049, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace skippy::server
