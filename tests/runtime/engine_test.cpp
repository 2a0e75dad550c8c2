// Engine-level restore behaviour the certifier does not cover: restores into a fragmented cache,
// a cache sequence evicted while a lane that restored from it keeps decoding, a shorter prefix
// served from a longer ResidentKv entry, and the SWA rule that forbids it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "skippy/certify/state_handoff.h"
#include "skippy/runtime/engine.h"
#include "skippy/runtime/sequence_state.h"
#include "test_env.h"

namespace {

using skippy::cache::PayloadKind;
using skippy::runtime::Engine;
using skippy::runtime::EngineOptions;
using skippy::runtime::Token;
namespace env = skippy::testing_env;

std::unique_ptr<Engine> Open(std::string_view family, uint32_t lanes) {
  EngineOptions o;
  o.model_path = env::ZooFile(family);
  o.context.n_ctx = 1024;
  o.context.flash_attn = true;
  o.lane_count = lanes;
  o.cache_seq_count = 2;
  o.context.n_threads = env::Threads();
  auto e = Engine::Open(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// skippy-server's layout (one stream per lane, flash attention off), 512 tokens per lane.
std::unique_ptr<Engine> OpenServerLayout(std::string_view family, uint32_t lanes) {
  auto e = Engine::Open(env::ServerLayout(family, /*flash_attn=*/false, lanes, /*n_ctx=*/512 * lanes));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

using env::Argmax;
using env::SameBytes;
using env::Tokens;

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// Fragmentation: other lanes leave holes, so the restored cells are not where the source had them.
// With flash attention the CPU kernel skips masked cells and visits the rest in cell order, so as
// long as the restored cells keep position order the logits stay byte-identical; a restore that
// scatters cells out of order may change the reduction order. The tolerance below (same greedy
// token, max |diff| <= 1e-3 on logits of magnitude ~1-10) is for that case; the test also records
// whether this run was byte-exact.
TEST(EngineRestore, StateRestoreIntoAFragmentedCacheKeepsTheGreedyToken) {
  for (auto [family, kind] : {std::pair{"qwen3next", PayloadKind::kKvRecurrent},
                              std::pair{"falcon-h1", PayloadKind::kKvRecurrent},
                              std::pair{"llama", PayloadKind::kFullState}}) {
    auto e = Open(family, 3);
    ASSERT_TRUE(e);
    const auto all = Tokens(*e, 129);
    const std::span<const Token> prefix(all.data(), 128), cont(all.data() + 128, 1);
    ASSERT_TRUE(e->Decode(0, prefix, 0).ok());
    auto bytes = e->ExportState(0, kind);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto src = e->Decode(0, cont, 128);
    ASSERT_TRUE(src.ok());
    ASSERT_TRUE(e->Clear(0).ok());

    // Holes: lane 1 takes 40 cells, lane 2 the next 60, then lane 1 leaves.
    const auto junk = Tokens(*e, 100);
    ASSERT_TRUE(e->Decode(1, std::span(junk.data(), 40), 0).ok());
    ASSERT_TRUE(e->Decode(2, std::span(junk.data() + 40, 60), 0).ok());
    ASSERT_TRUE(e->Clear(1).ok());

    ASSERT_TRUE(e->ImportState(*bytes, 0, kind).ok());
    auto restored = e->Decode(0, cont, 128);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(Argmax(*restored), Argmax(*src)) << family;
    EXPECT_LE(MaxAbsDiff(*restored, *src), 1e-3) << family;
    RecordProperty(std::string(family) + "_byte_exact", SameBytes(*restored, *src) ? "yes" : "no");
  }
}

TEST(EngineRestore, EvictingTheCacheSequenceDoesNotDisturbALaneThatRestoredFromIt) {
  auto e = Open("llama", 2);
  ASSERT_TRUE(e);
  const auto all = Tokens(*e, 145);
  const std::span<const Token> prefix(all.data(), 128), cont(all.data() + 128, 1), suffix(all.data() + 129, 16);
  ASSERT_TRUE(e->Decode(0, prefix, 0).ok());
  auto record = e->RecordResident(0, 128, e->cache_seq(0));
  ASSERT_TRUE(record.ok()) << record.status();
  auto src_cont = e->Decode(0, cont, 128);
  auto src_suffix = e->Decode(0, suffix, 129);
  ASSERT_TRUE(src_cont.ok() && src_suffix.ok());
  ASSERT_TRUE(e->Clear(0).ok());

  ASSERT_TRUE(e->RestoreResident(*record, 1, 128).ok());
  ASSERT_TRUE(e->Clear(record->cache_seq).ok());  // evicted while lane 1 holds the prefix
  EXPECT_EQ(e->SequenceLength(record->cache_seq), 0);
  auto cont_after = e->Decode(1, cont, 128);
  auto suffix_after = e->Decode(1, suffix, 129);
  ASSERT_TRUE(cont_after.ok() && suffix_after.ok());
  EXPECT_TRUE(SameBytes(*cont_after, *src_cont));
  EXPECT_TRUE(SameBytes(*suffix_after, *src_suffix));

  // The record is gone: restoring from it is a clear error, not a silent empty lane.
  auto again = e->RestoreResident(*record, 0, 128);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

TEST(EngineRestore, AttentionKvServesAShorterPrefixOfALongerEntry) {
  auto e = Open("qwen3", 2);
  ASSERT_TRUE(e);
  const auto all = Tokens(*e, 129);
  ASSERT_TRUE(e->Decode(0, std::span(all.data(), 128), 0).ok());
  auto record = e->RecordResident(0, 128, e->cache_seq(0));
  ASSERT_TRUE(record.ok());
  ASSERT_TRUE(e->Clear(0).ok());
  // Reference: recompute the first 64 tokens, then the rest, in a lane of its own.
  ASSERT_TRUE(e->Decode(0, std::span(all.data(), 64), 0).ok());
  auto reference = e->Decode(0, std::span(all.data() + 64, 65), 64);
  ASSERT_TRUE(reference.ok());
  ASSERT_TRUE(e->Clear(0).ok());
  // Hit: share 64 of the 128 resident tokens, compute the same 65 tokens.
  ASSERT_TRUE(e->RestoreResident(*record, 1, 64).ok());
  EXPECT_EQ(e->SequenceLength(1), 64);
  auto hit = e->Decode(1, std::span(all.data() + 64, 65), 64);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(Argmax(*hit), Argmax(*reference));
  EXPECT_LE(MaxAbsDiff(*hit, *reference), 1e-3);
  RecordProperty("shorter_prefix_byte_exact", SameBytes(*hit, *reference) ? "yes" : "no");
}

TEST(EngineRestore, SlidingWindowEntryServesOnlyItsExactLength) {
  auto e = Open("gemma3", 2);
  ASSERT_TRUE(e);
  const auto all = Tokens(*e, 128);
  ASSERT_TRUE(e->Decode(0, all, 0).ok());
  auto record = e->RecordResident(0, 128, e->cache_seq(0));
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(e->RestoreResident(*record, 1, 100).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(e->RestoreResident(*record, 1, 128).ok());
}

// Within the window (tiny gemma3: 32 tokens) the SWA layers still hold every cell, so an entry
// serves shorter prefixes, resident and stored alike, byte for byte.
TEST(EngineRestore, SlidingWindowEntryWithinTheWindowServesShorterPrefixes) {
  auto e = Open("gemma3", 2);
  ASSERT_TRUE(e);
  ASSERT_GE(e->model().n_swa(), 30);
  const auto all = Tokens(*e, 30);
  const std::span<const Token> head(all.data(), 20), tail(all.data() + 20, 10);
  ASSERT_TRUE(e->Decode(0, head, 0).ok());
  auto reference = e->Decode(0, tail, 20);
  ASSERT_TRUE(reference.ok());
  auto record = e->RecordResident(0, 30, e->cache_seq(0));
  ASSERT_TRUE(record.ok());
  ASSERT_TRUE(e->Clear(0).ok());

  ASSERT_TRUE(e->RestoreResident(*record, 1, 20).ok());
  auto resident_hit = e->Decode(1, tail, 20);
  ASSERT_TRUE(resident_hit.ok());
  EXPECT_TRUE(SameBytes(*resident_hit, *reference));

  auto bytes = e->ExportResident(e->cache_seq(0));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_TRUE(e->Clear(e->cache_seq(0)).ok());
  ASSERT_TRUE(e->ImportResident(*bytes, 1).ok());
  ASSERT_TRUE(e->Truncate(1, 20).ok());
  auto stored_hit = e->Decode(1, tail, 20);
  ASSERT_TRUE(stored_hit.ok());
  EXPECT_TRUE(SameBytes(*stored_hit, *reference));
}

// The server's default layout: one KV stream per lane, no cache sequences. A prompt's KV exported
// from one lane and imported into another (fresh) lane lands in the same cells and continues byte
// for byte like the source, with a 64+-row suffix batch (the tiled flash-attention path, which
// groups cells into tiles by absolute index). A sliding-window export longer than the window holds
// only the window; unpadded, an import put it at the start of the stream instead of where the
// source had it and the continuation differed in the last bits (gemma2, gemma3). ImportResident
// pads it back to position 0 (sequence_state.h), which this checks past the window.
class PerLaneStreams : public ::testing::TestWithParam<std::string> {};

TEST_P(PerLaneStreams, ImportedPromptContinuesLikeTheSource) {
  auto opened = Engine::Open(env::ServerLayout(GetParam(), /*flash_attn=*/true, /*lanes=*/2, /*n_ctx=*/2048));
  ASSERT_TRUE(opened.ok()) << opened.status();
  Engine& e = **opened;
  // Sliding-window families: well past the window, so the export holds only the window.
  const size_t prefix = e.model().n_swa() > 0 ? static_cast<size_t>(e.model().n_swa()) + 300 : 300;
  const auto all = Tokens(e, static_cast<int32_t>(prefix + 100));
  ASSERT_EQ(all.size(), prefix + 100);
  const std::span<const Token> t(all);
  const size_t first = std::min<size_t>(prefix, 128);
  ASSERT_TRUE(e.Decode(0, t.subspan(0, first), 0).ok());
  if (prefix > first) {
    ASSERT_TRUE(e.Decode(0, t.subspan(first, prefix - first), static_cast<int32_t>(first)).ok());
  }
  auto bytes = e.ExportResident(0);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto reference = e.Decode(0, t.subspan(prefix, 100), static_cast<int32_t>(prefix));
  ASSERT_TRUE(reference.ok());
  ASSERT_TRUE(e.ImportResident(*bytes, 1, t.first(prefix)).ok());
  auto hit = e.Decode(1, t.subspan(prefix, 100), static_cast<int32_t>(prefix));
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(SameBytes(*hit, *reference)) << "max |diff| " << MaxAbsDiff(*hit, *reference);

  // Below the imported length the SWA layers hold padding cells: the lane cannot be cut there.
  const bool swa = e.model().n_swa() > 0;
  EXPECT_EQ(e.PaddedPrefix(1), swa ? static_cast<int32_t>(prefix) : 0);
  EXPECT_EQ(e.Truncate(1, static_cast<int32_t>(prefix) - 1).code(),
            swa ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kOk);
  if (swa) {
    EXPECT_EQ(e.SequenceLength(1), static_cast<int32_t>(prefix + 100));
    EXPECT_TRUE(e.Truncate(1, static_cast<int32_t>(prefix)).ok());
    EXPECT_TRUE(e.Truncate(1, 0).ok());
    EXPECT_EQ(e.PaddedPrefix(1), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, PerLaneStreams,
                         ::testing::Values("llama", "deepseek2", "gemma3", "gemma2", "gemma4-a4b", "gemma4-e4b"));

// Prefill (no output row) leaves the state Decode leaves: the server prefills every chunk but a
// prompt's last this way. Two lanes take the same chunks, one with Decode and one with Prefill;
// their exported states (the family's production payload) and continuations must be byte-equal.
class PrefillWithoutLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefillWithoutLogits, LeavesTheStateDecodeLeaves) {
  auto opened = OpenServerLayout(GetParam(), 1);
  ASSERT_TRUE(opened);
  Engine& e = *opened;
  const auto all = Tokens(e, 200);
  ASSERT_EQ(all.size(), 200u);
  const std::span<const Token> t(all);
  const PayloadKind kind = e.family().payload;
  struct Run {
    std::vector<uint8_t> state;
    std::vector<float> next;
  };
  auto Prompt = [&](bool with_logits) -> Run {
    EXPECT_TRUE(e.Clear(0).ok());
    for (const auto& [from, to] : {std::pair<size_t, size_t>{0, 70}, {70, 150}}) {
      const auto chunk = t.subspan(from, to - from);
      const bool ok = with_logits ? e.Decode(0, chunk, static_cast<int32_t>(from)).ok()
                                  : e.Prefill(0, chunk, static_cast<int32_t>(from)).ok();
      EXPECT_TRUE(ok);
    }
    auto state = kind == PayloadKind::kResidentKv ? e.ExportResident(0) : e.ExportState(0, kind);
    auto next = e.Decode(0, t.subspan(150, 50), 150);
    EXPECT_TRUE(state.ok() && next.ok());
    return {state.ok() ? *state : std::vector<uint8_t>{}, next.ok() ? *next : std::vector<float>{}};
  };
  const Run decoded = Prompt(/*with_logits=*/true);
  const Run prefilled = Prompt(/*with_logits=*/false);
  ASSERT_FALSE(decoded.state.empty());
  EXPECT_TRUE(decoded.state == prefilled.state) << "exported states differ";
  ASSERT_FALSE(decoded.next.empty());
  EXPECT_TRUE(SameBytes(decoded.next, prefilled.next)) << "max |diff| " << MaxAbsDiff(decoded.next, prefilled.next);
  EXPECT_EQ(e.Prefill(0, t.subspan(0, 4), 3).code(), absl::StatusCode::kInvalidArgument);  // not an append
}

INSTANTIATE_TEST_SUITE_P(Families, PrefillWithoutLogits,
                         ::testing::Values("llama", "qwen3", "glm4", "olmo", "gemma2", "gemma3", "gemma4-a4b", "gemma4-e4b",
                                           "deepseek2", "deepseek3", "glm47-flash", "minimax-m27", "qwen3next", "falcon-h1"));

// Hybrid lane reuse: a lane that computed prompt A = P + X and decoded a few tokens after it gets
// only the recurrent state of a record at P (RestoreRecurrentOnto) and its attention KV cut to P;
// a suffix then continues byte for byte like a lane that prefilled P itself.
class RecurrentOnto : public ::testing::TestWithParam<std::string> {};

TEST_P(RecurrentOnto, ContinuesLikeARecompute) {
  auto opened = OpenServerLayout(GetParam(), 2);
  ASSERT_TRUE(opened);
  Engine& e = *opened;
  ASSERT_EQ(e.family().payload, PayloadKind::kKvRecurrent);
  const auto all = Tokens(e, 260);
  ASSERT_EQ(all.size(), 260u);
  const std::span<const Token> t(all);
  const size_t p = 130;
  // Lane 0: P, the record, then X and three one-row decodes (generated tokens).
  ASSERT_TRUE(e.Prefill(0, t.first(p), 0).ok());
  auto full = e.ExportState(0, PayloadKind::kKvRecurrent);
  ASSERT_TRUE(full.ok()) << full.status();
  auto record = skippy::runtime::RecurrentPartOfHybridState(*full);
  ASSERT_TRUE(record.ok()) << record.status();
  // The cut-out part is what llama.cpp exports with PARTIAL_ONLY.
  auto partial = e.ExportState(0, PayloadKind::kRecurrentOnly);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_TRUE(*partial == *record) << partial->size() << " vs " << record->size() << " bytes";
  ASSERT_TRUE(e.Decode(0, t.subspan(p, 40), static_cast<int32_t>(p)).ok());
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(e.Decode(0, t.subspan(200 + i, 1), static_cast<int32_t>(p + 40 + i)).ok());
  // Lane 1: the recompute.
  ASSERT_TRUE(e.Prefill(1, t.first(p), 0).ok());
  auto reference = e.Decode(1, t.subspan(p + 80, 50), static_cast<int32_t>(p));
  ASSERT_TRUE(reference.ok());

  // Refused without touching the lane: more tokens than it holds, bytes that do not split.
  EXPECT_EQ(e.RestoreRecurrentOnto(*record, 0, 200).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t> cut(full->begin(), full->begin() + 64);
  EXPECT_EQ(skippy::runtime::RecurrentPartOfHybridState(cut).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.RestoreRecurrentOnto(std::span(cut).first(8), 0, static_cast<int32_t>(p)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.SequenceLength(0), static_cast<int32_t>(p + 43));

  const absl::Status restored = e.RestoreRecurrentOnto(*record, 0, static_cast<int32_t>(p));
  ASSERT_TRUE(restored.ok()) << restored;
  EXPECT_EQ(e.SequenceLength(0), static_cast<int32_t>(p));
  auto hit = e.Decode(0, t.subspan(p + 80, 50), static_cast<int32_t>(p));
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(SameBytes(*hit, *reference)) << "max |diff| " << MaxAbsDiff(*hit, *reference);

  // A record of another length does not fit the cut: refused, lane cleared.
  ASSERT_TRUE(e.Clear(0).ok());
  ASSERT_TRUE(e.Prefill(0, t.first(200), 0).ok());
  EXPECT_EQ(e.RestoreRecurrentOnto(*record, 0, 150).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(e.SequenceLength(0), 0);
}

// A record's payload built after the fact (HybridStateAt): the attention KV cut from a later export
// of the same lane plus the recurrent state copied at the boundary equals the export at the boundary.
TEST_P(RecurrentOnto, StateBuiltLaterEqualsTheExportAtTheBoundary) {
  auto opened = OpenServerLayout(GetParam(), 1);
  ASSERT_TRUE(opened);
  Engine& e = *opened;
  const auto all = Tokens(e, 200);
  ASSERT_EQ(all.size(), 200u);
  const std::span<const Token> t(all);
  ASSERT_TRUE(e.Prefill(0, t.first(130), 0).ok());
  auto at_boundary = e.ExportState(0, PayloadKind::kKvRecurrent);
  auto part = e.ExportState(0, PayloadKind::kRecurrentOnly);
  ASSERT_TRUE(at_boundary.ok() && part.ok());
  ASSERT_TRUE(e.Decode(0, t.subspan(130, 70), 130).ok());
  auto later = e.ExportState(0, PayloadKind::kKvRecurrent);
  ASSERT_TRUE(later.ok());
  auto built = skippy::runtime::HybridStateAt(*later, 130, *part);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_TRUE(*built == *at_boundary) << built->size() << " vs " << at_boundary->size() << " bytes";
  // Not past what the later export holds; not from a cut export.
  EXPECT_EQ(skippy::runtime::HybridStateAt(*later, 201, *part).status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t> cut(later->begin(), later->begin() + later->size() / 2);
  EXPECT_FALSE(skippy::runtime::HybridStateAt(cut, 130, *part).ok());
}

INSTANTIATE_TEST_SUITE_P(Families, RecurrentOnto, ::testing::Values("qwen3next", "falcon-h1"));

TEST(EngineInput, BadSequenceIdsAndNonAppendingDecodesAreRefused) {
  auto e = Open("llama", 2);
  ASSERT_TRUE(e);
  const auto all = Tokens(*e, 8);
  EXPECT_EQ(e->Decode(5, all, 0).status().code(), absl::StatusCode::kInvalidArgument);   // not a lane
  EXPECT_EQ(e->Decode(-1, all, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Decode(0, all, 3).status().code(), absl::StatusCode::kInvalidArgument);   // gap
  EXPECT_EQ(e->RecordResident(0, 4, 0).status().code(), absl::StatusCode::kInvalidArgument);  // 0 is a lane
  EXPECT_EQ(e->RecordResident(0, 4, e->cache_seq(0)).status().code(), absl::StatusCode::kInvalidArgument);  // empty
  EXPECT_EQ(e->ImportState({}, 0, PayloadKind::kFullState).code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> garbage(64, 0xab);
  EXPECT_EQ(e->ImportState(garbage, 0, PayloadKind::kFullState).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(e->SequenceLength(0), 0);
  // Still usable.
  EXPECT_TRUE(e->Decode(0, all, 0).ok());
}

// A lane of its own stream holds its share of the context: tokens past it are refused by the engine
// with the lane named, before llama.cpp looks for cells, and leave the lane as it was.
TEST(EngineInput, TokensPastALanesCellsAreRefused) {
  auto e = OpenServerLayout("llama", 2);
  ASSERT_TRUE(e);
  const int32_t cap = e->LaneCapacity();
  ASSERT_EQ(cap, 512);
  const auto all = Tokens(*e, cap + 1);
  const std::span<const Token> most(all.data(), static_cast<size_t>(cap) - 1);
  ASSERT_TRUE(e->Prefill(1, most, 0).ok());
  auto past = e->Decode(1, std::span<const Token>(all.data() + cap - 1, 2), cap - 1);
  ASSERT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("lane 1"), std::string_view::npos) << past.status();
  EXPECT_EQ(e->Prefill(1, std::span<const Token>(all.data() + cap - 1, 2), cap - 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->SequenceLength(1), cap - 1);
  EXPECT_TRUE(e->Decode(1, std::span<const Token>(all.data() + cap - 1, 1), cap - 1).ok());  // the last cell
}

}  // namespace
