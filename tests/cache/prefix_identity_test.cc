#include "skippy/cache/prefix_identity.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace skippy::cache {
namespace {

using testing::MakeScope;

TEST(PrefixIdentity, EqualScopesHaveEqualFingerprints) {
  EXPECT_EQ(MakeScope(), MakeScope());
  EXPECT_EQ(MakeScope().Fingerprint(), MakeScope().Fingerprint());
  EXPECT_EQ(MakeScope().Digest(), MakeScope().Digest());
}

TEST(PrefixIdentity, EveryFieldChangesIdentity) {
  const PrefixScope base = MakeScope();
  std::vector<PrefixScope> variants(16, base);
  variants[0].config.model_id = "model-b";
  variants[1].config.layer_begin = 1;
  variants[2].config.layer_end = 8;
  variants[3].config.runtime_abi = "skippy-rt-2";
  variants[4].config.llama_version = "b0001";
  variants[5].config.type_k = "q8_0";
  variants[6].config.type_v = "q8_0";
  variants[7].config.flash_attn = true;
  variants[8].config.v_trans = false;
  variants[9].config.kv_unified = true;
  variants[10].config.swa_full = true;
  variants[11].config.n_ctx = 4096;
  variants[12].config.position_config = "yarn";
  variants[13].config.n_vocab = 999;
  variants[14].config.token_start = 5;
  variants[15].cache_namespace = "tenant-b";
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_FALSE(variants[i] == base) << i;
    EXPECT_NE(variants[i].Fingerprint(), base.Fingerprint()) << i;
    EXPECT_NE(variants[i].Digest(), base.Digest()) << i;
  }
}

TEST(PrefixIdentity, EncodingIsLengthPrefixedSoFieldsCannotShift) {
  PrefixScope a = MakeScope();
  PrefixScope b = MakeScope();
  a.config.type_k = "f1";
  a.config.type_v = "6f16";
  b.config.type_k = "f16";
  b.config.type_v = "f16";
  EXPECT_NE(a.CanonicalEncoding(), b.CanonicalEncoding());
}

TEST(PrefixIdentity, ValidateRejectsBadConfig) {
  PrefixScope s = MakeScope();
  EXPECT_TRUE(s.Validate().ok());
  s.config.model_id.clear();
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s = MakeScope();
  s.config.layer_end = s.config.layer_begin;
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s = MakeScope("", 0);
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrefixIdentity, EmptyPromptIsInvalid) {
  Status st = ValidateTokens(MakeScope().config, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("empty prompt"), std::string_view::npos);
}

TEST(PrefixIdentity, TokenOutsideVocabularyIsInvalidAndNamed) {
  std::vector<Token> t = {1, 2, 1000};
  Status st = ValidateTokens(MakeScope("", 1000).config, t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("position 2"), std::string_view::npos) << st;
  t = {-1};
  EXPECT_EQ(ValidateTokens(MakeScope().config, t).code(), absl::StatusCode::kInvalidArgument);
  t = {0, 999};
  EXPECT_TRUE(ValidateTokens(MakeScope("", 1000).config, t).ok());
}

TEST(PayloadKind, NamesRoundTrip) {
  for (int i = 0; i < kPayloadKindCount; ++i) {
    auto kind = static_cast<PayloadKind>(i);
    StatusOr<PayloadKind> parsed = ParsePayloadKind(PayloadKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(PayloadKindName(PayloadKind::kResidentKv), "resident-kv");
  EXPECT_EQ(PayloadKindName(PayloadKind::kKvRecurrent), "kv-recurrent");
  EXPECT_EQ(PayloadKindName(PayloadKind::kFullState), "full-state");
  EXPECT_EQ(PayloadKindName(PayloadKind::kRecurrentOnly), "recurrent-only");
  EXPECT_EQ(ParsePayloadKind("kv").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace skippy::cache
