#include "skippy/cache/family_policy.h"

#include <gtest/gtest.h>

namespace skippy::cache {
namespace {

ModelFacts Facts(std::string arch, std::vector<std::string> tensors = {"blk.0.attn_q.weight"},
                 bool hybrid = false) {
  ModelFacts f;
  f.arch = std::move(arch);
  f.tensor_names = std::move(tensors);
  f.memory_is_hybrid = hybrid;
  return f;
}

TEST(FamilyPolicy, TableHasThirteenFamiliesPlusDeepSeek3InEvidenceOrder) {
  auto rows = KnownFamilies();
  ASSERT_EQ(rows.size(), 14u);
  const char* keys[] = {"qwen3next", "falcon-h1", "llama", "qwen3", "deepseek2", "glm47-flash", "glm4",
                        "gemma4-a4b", "gemma4-e4b", "gemma3", "gemma2", "olmo", "minimax-m27", "deepseek3"};
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].key, keys[i]);
  EXPECT_EQ(FindFamilyByKey("deepseek3")->arch, "deepseek2");
  EXPECT_TRUE(FindFamilyByKey("deepseek3")->package_only);
  EXPECT_EQ(FindFamilyByKey("minimax-m27")->arch, "minimax-m2");
}

TEST(FamilyPolicy, DenseFamilyGetsResidentKv) {
  FamilyDecision d = FamilyPolicy().Decide(Facts("llama"));
  EXPECT_TRUE(d.enabled) << d.reason;
  EXPECT_EQ(d.payload, PayloadKind::kResidentKv);
  EXPECT_EQ(d.family_key, "llama");
  EXPECT_FALSE(d.recurrent);
}

TEST(FamilyPolicy, HybridFamilyGetsKvRecurrentOnly) {
  FamilyDecision d = FamilyPolicy().Decide(Facts("qwen3next", {"blk.0.ssm_conv1d.weight"}, true));
  EXPECT_TRUE(d.enabled);
  EXPECT_EQ(d.payload, PayloadKind::kKvRecurrent);
  EXPECT_TRUE(d.recurrent);
  d = FamilyPolicy().Decide(Facts("falcon-h1", {"blk.0.attn_q.weight"}));  // table says hybrid
  EXPECT_EQ(d.payload, PayloadKind::kKvRecurrent);
}

TEST(FamilyPolicy, RecurrentMarkersAreDetected) {
  for (const char* name : {"blk.3.ssm_a", "blk.1.attn.ssm.x", "blk.0.time_mix_k", "recurrent_gate", "rwkv.w"}) {
    EXPECT_TRUE(IsRecurrentTensorName(name)) << name;
  }
  EXPECT_FALSE(IsRecurrentTensorName("blk.0.attn_k.weight"));
  EXPECT_FALSE(IsRecurrentTensorName("token_embd.weight"));
}

TEST(FamilyPolicy, RecurrentTensorsInDenseFamilyNeverGetKvOnlyReuse) {
  FamilyDecision d = FamilyPolicy().Decide(Facts("llama", {"blk.0.attn_q.weight", "blk.0.ssm_dt"}));
  EXPECT_FALSE(d.enabled);
  EXPECT_NE(d.payload, PayloadKind::kResidentKv);
  EXPECT_NE(d.reason.find("ssm_dt"), std::string::npos) << d.reason;
  d = FamilyPolicy().Decide(Facts("qwen3", {"blk.0.attn_q.weight"}, /*hybrid=*/true));
  EXPECT_FALSE(d.enabled);
}

TEST(FamilyPolicy, UnknownArchitectureIsLearnedAndDisabledUntilCertified) {
  FamilyDecision d = FamilyPolicy().Decide(Facts("mystery"));
  EXPECT_FALSE(d.enabled);
  EXPECT_TRUE(d.learned);
  EXPECT_EQ(d.family_key, "mystery");
  EXPECT_EQ(d.payload, PayloadKind::kResidentKv);
  EXPECT_NE(d.reason.find("until a certification run"), std::string::npos) << d.reason;
  Status st = FamilyPolicy().ValidateRequest(d, PayloadKind::kResidentKv);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);

  const FamilyDecision ok = Certified(d);
  EXPECT_TRUE(ok.enabled);
  EXPECT_TRUE(ok.reason.empty());
  EXPECT_TRUE(FamilyPolicy().ValidateRequest(ok, PayloadKind::kResidentKv).ok());
  // Still a dense payload: KV plus recurrent state is refused as for a table family.
  EXPECT_EQ(FamilyPolicy().ValidateRequest(ok, PayloadKind::kKvRecurrent).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FamilyPolicy, UnknownRecurrentArchitectureLearnsKvRecurrent) {
  FamilyDecision d = FamilyPolicy().Decide(Facts("mystery-ssm", {"blk.0.ssm_conv1d.weight"}));
  EXPECT_TRUE(d.learned);
  EXPECT_TRUE(d.recurrent);
  EXPECT_EQ(d.payload, PayloadKind::kKvRecurrent);
  const FamilyDecision ok = Certified(d);
  EXPECT_TRUE(FamilyPolicy().ValidateRequest(ok, PayloadKind::kKvRecurrent).ok());
  EXPECT_EQ(FamilyPolicy().ValidateRequest(ok, PayloadKind::kResidentKv).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FamilyPolicy, CertifiedLeavesTableDecisionsAlone) {
  FamilyPolicy policy({{"gemma2", false, "restore differs at token 17"}});
  const FamilyDecision d = Certified(policy.Decide(Facts("gemma2")));
  EXPECT_FALSE(d.enabled);
  EXPECT_FALSE(d.learned);
  FamilyDecision none = FamilyPolicy().Decide(Facts(""));
  EXPECT_FALSE(none.learned);
  EXPECT_FALSE(Certified(none).enabled);
}

TEST(FamilyPolicy, CertificationTableDisablesFamilyWithReason) {
  FamilyPolicy policy({{"gemma2", false, "restore differs at token 17"}});
  FamilyDecision d = policy.Decide(Facts("gemma2"));
  EXPECT_FALSE(d.enabled);
  EXPECT_EQ(d.reason, "restore differs at token 17");
  EXPECT_TRUE(policy.Decide(Facts("gemma3")).enabled);
  Status st = policy.ValidateRequest(d, PayloadKind::kResidentKv);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("restore differs"), std::string_view::npos);
}

TEST(FamilyPolicy, SharedArchResolvedByFamilyKey) {
  ModelFacts f = Facts("deepseek2");
  EXPECT_EQ(FamilyPolicy().Decide(f).family_key, "deepseek2");
  f.family_key = "glm47-flash";
  EXPECT_EQ(FamilyPolicy().Decide(f).family_key, "glm47-flash");
  f.family_key = "gemma3";  // wrong arch for the key
  EXPECT_FALSE(FamilyPolicy().Decide(f).enabled);
}

TEST(FamilyPolicy, KvRecurrentOnDenseFamilyIsRefused) {
  FamilyPolicy policy;
  FamilyDecision d = policy.Decide(Facts("llama"));
  Status st = policy.ValidateRequest(d, PayloadKind::kKvRecurrent);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("dense family llama"), std::string_view::npos) << st;
  EXPECT_TRUE(policy.ValidateRequest(d, PayloadKind::kResidentKv).ok());
}

TEST(FamilyPolicy, ResidentKvOnHybridFamilyIsRefused) {
  FamilyPolicy policy;
  FamilyDecision d = policy.Decide(Facts("qwen3next", {"blk.0.ssm_in"}, true));
  Status st = policy.ValidateRequest(d, PayloadKind::kResidentKv);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("KV-only reuse"), std::string_view::npos) << st;
  EXPECT_TRUE(policy.ValidateRequest(d, PayloadKind::kKvRecurrent).ok());
}

TEST(FamilyPolicy, DiagnosticPayloadsAreNeverProduction) {
  FamilyPolicy policy;
  FamilyDecision d = policy.Decide(Facts("llama"));
  EXPECT_EQ(policy.ValidateRequest(d, PayloadKind::kFullState).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(policy.ValidateRequest(d, PayloadKind::kFullState, /*allow_diagnostic=*/true).ok());
}

}  // namespace
}  // namespace skippy::cache
