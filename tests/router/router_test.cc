// skippy-router's decisions without a network: the policy (prefix while loads are balanced, load
// otherwise, round robin as the baseline) and the replica view built from cache events.
#include <gtest/gtest.h>

#include <set>

#include "skippy/router/policy.h"
#include "skippy/router/replica_view.h"

namespace skippy::router {
namespace {

using nlohmann::json;

std::vector<Token> Range(Token a, Token b) {
  std::vector<Token> v;
  for (Token t = a; t < b; ++t) v.push_back(t);
  return v;
}

TEST(Policy, PrefixWinsWhileLoadsAreBalanced) {
  uint64_t rr = 0;
  std::vector<Candidate> cs(3, Candidate{true, 0, 1, 0});
  cs[2].matched = 80;
  cs[2].in_flight = 1;  // one request per lane above the idlest: still balanced
  auto c = Choose(Policy::kCacheAware, {}, cs, 100, rr);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->replica, 2u);
  EXPECT_EQ(c->by, RoutedBy::kPrefix);
}

TEST(Policy, LoadWinsOnceOutOfBalanceOrWhenTheMatchIsSmall) {
  uint64_t rr = 0;
  std::vector<Candidate> cs(3, Candidate{true, 0, 1, 0});
  cs[2].matched = 80;
  cs[2].in_flight = 3;
  cs[1].in_flight = 1;
  auto c = Choose(Policy::kCacheAware, {}, cs, 100, rr);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->replica, 0u);
  EXPECT_EQ(c->by, RoutedBy::kLoad);
  cs[2].in_flight = 0;
  cs[2].matched = 10;  // below the threshold (0.3 of 100)
  c = Choose(Policy::kCacheAware, {}, cs, 100, rr);
  EXPECT_EQ(c->by, RoutedBy::kLoad);
  EXPECT_NE(c->replica, 1u);
}

TEST(Policy, LanesScaleTheLoadAndUnhealthyReplicasAreSkipped) {
  uint64_t rr = 0;
  std::vector<Candidate> cs = {{true, 4, 4, 0}, {true, 2, 1, 0}, {false, 0, 1, 90}};
  auto c = Choose(Policy::kCacheAware, {}, cs, 100, rr);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->replica, 0u);  // 1 request per lane against 2
  cs[0].healthy = cs[1].healthy = false;
  EXPECT_FALSE(Choose(Policy::kCacheAware, {}, cs, 100, rr).has_value());
}

TEST(Policy, RoundRobinTakesTurnsAndTiesSpread) {
  uint64_t rr = 0;
  std::vector<Candidate> cs(3, Candidate{true, 0, 1, 0});
  std::vector<size_t> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(Choose(Policy::kRoundRobin, {}, cs, 0, rr)->replica);
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
  // Cache-aware with nothing cached and equal loads also spreads.
  std::set<size_t> spread;
  for (int i = 0; i < 3; ++i) spread.insert(Choose(Policy::kCacheAware, {}, cs, 100, rr)->replica);
  EXPECT_EQ(spread.size(), 3u);
}

TEST(ReplicaView, LearnsEntriesLanesAndForgetsOnRestart) {
  ReplicaView v;
  v.Apply(json{{"kind", "hello"}, {"instance", "a"}, {"lanes", 2}});
  v.Apply(json{{"kind", "stored"}, {"entry", 1}, {"ns", "n1"}, {"tokens", Range(0, 100)}, {"shorter", true}});
  v.Apply(json{{"kind", "stored"}, {"entry", 2}, {"ns", "n1"}, {"tokens", Range(500, 600)}, {"shorter", false}});
  auto q = Range(0, 50);
  q.push_back(9999);
  EXPECT_EQ(v.Match("n1", q), 50u);              // serves a shorter prefix
  EXPECT_EQ(v.Match("n2", q), 0u);               // another namespace
  EXPECT_EQ(v.Match("n1", Range(500, 550)), 0u);  // exact-length entry: whole only
  EXPECT_EQ(v.Match("n1", Range(500, 700)), 100u);
  v.Apply(json{{"kind", "lane"}, {"lane", 0}, {"ns", "n1"}, {"tokens", Range(1000, 1200)}});
  EXPECT_EQ(v.Match("n1", Range(1000, 1100)), 100u);
  v.Apply(json{{"kind", "removed"}, {"entry", 1}});
  EXPECT_EQ(v.Match("n1", q), 0u);
  EXPECT_EQ(v.entries(), 1u);
  v.Apply(json{{"kind", "hello"}, {"instance", "a"}});  // a reconnect to the same process keeps it
  EXPECT_EQ(v.entries(), 1u);
  v.Apply(json{{"kind", "hello"}, {"instance", "b"}});  // a restarted process: empty RAM
  EXPECT_EQ(v.entries(), 0u);
  EXPECT_EQ(v.Match("n1", Range(1000, 1100)), 0u);
}

TEST(ReplicaView, RoutedPromptsCountUntilPushedOutAndBadEventsAreIgnored) {
  ReplicaView v(2);
  v.Routed("n", Range(0, 10));
  v.Routed("n", Range(100, 110));
  EXPECT_EQ(v.Match("n", Range(0, 20)), 10u);
  v.Routed("n", Range(200, 210));
  EXPECT_EQ(v.Match("n", Range(0, 20)), 0u);
  v.Apply(json{{"kind", "stored"}, {"entry", "x"}, {"tokens", 5}});
  v.Apply(json::array());
  v.Apply(json{{"kind", "cleared"}, {"ns", "n"}});
  EXPECT_EQ(v.Match("n", Range(200, 210)), 0u);
}

}  // namespace
}  // namespace skippy::router
