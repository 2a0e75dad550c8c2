// One graph through the patch series' ragged split: steps with a prompt chunk
// (Engine::DecodeStepWithChunks: prompt chunks of some lanes and the generated tokens of others in
// one llama_decode) and steps of lanes whose ids do not follow each other (Engine::DecodeStep).
// Every row must come out as it does alone: each chunk's last logits as Decode's, each lane's step
// as DecodeStep's alone, each lane's exported state byte for byte, and the next step's logits;
// on dense, sliding-window and MLA families (and hybrids for lanes apart), F16 and Q4_K_M, flash
// attention on and off. Each test switches the one-row class on before its first model
// (process-wide; ctest runs each test in a process of its own).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <vector>

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

#define REQUIRE_RAGGED_SPLIT()                                                                   \
  if (!skippy::runtime::SetOneRowClass(true) || !skippy::runtime::OneRowClass() ||                   \
      !skippy::runtime::RaggedSplitAvailable())                                                        \
  GTEST_SKIP() << "this llama.cpp build has no one-row class or ragged split (built without the patch series)"

std::unique_ptr<Engine> Open(const std::string& path_or_family, bool flash_attn, uint32_t lanes,
                             std::atomic<uint64_t>* graphs = nullptr) {
  return env::OpenServerLayout(path_or_family, flash_attn, lanes, graphs);
}

// Four lanes of unequal lengths; chunks of 1, 7 and 40 rows into one lane (not always the lowest
// id) beside one to three stepping lanes, and chunks into two or three lanes (not in lane order,
// of equal and unequal lengths, up to 134 rows) beside none or some, compared with the same rows
// alone (a chunk without an output row by its lane's exported state and next step). Then the
// startup check.
void ExpectEveryRowAsAlone(const std::string& model) {
  for (bool fa : {true, false}) {
    SCOPED_TRACE(StrCat(model, " flash_attn=", fa));
    auto e = Open(model, fa, 4);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->CanStepWithChunk());
    const auto tokens = env::Tokens(*e, 400);
    const int32_t lengths[4] = {300, 37, 180, 5};
    struct Case {
      std::vector<std::pair<int32_t, size_t>> chunks;  // lane, rows
      std::vector<int32_t> stepping;
    };
    // Among the chunks, equal runs on lanes that follow each other (llama.cpp's stock multi-stream
    // ubatch) and on lanes apart, a group of 64+ rows, and every second chunk without an output row.
    const Case cases[] = {{{{0, 40}}, {1, 2, 3}},     {{{2, 7}}, {0}},
                          {{{3, 1}}, {1, 2}},         {{{1, 40}}, {3}},
                          {{{0, 40}, {2, 7}}, {1, 3}}, {{{3, 1}, {1, 40}}, {}},
                          {{{2, 7}, {0, 40}, {3, 1}}, {1}}, {{{0, 16}, {1, 16}}, {}},
                          {{{0, 16}, {2, 16}}, {1, 3}}, {{{1, 70}, {3, 64}}, {0}}};
    for (const Case& c : cases) {
      std::string what;
      for (const auto& [lane, rows] : c.chunks) what += StrCat(" ", rows, " rows into lane ", lane);
      SCOPED_TRACE(StrCat("chunks of", what));
      for (int32_t l = 0; l < 4; ++l) {
        ASSERT_TRUE(e->Clear(l).ok());
        ASSERT_TRUE(e->Prefill(l, std::span(tokens).first(static_cast<size_t>(lengths[l])), 0).ok());
      }
      std::vector<Engine::ChunkIn> chunks;
      for (const auto& [lane, rows] : c.chunks) {
        chunks.push_back({lane, std::span(tokens).subspan(static_cast<size_t>(lengths[lane]), rows), lengths[lane],
                          chunks.size() % 2 == 0});
      }
      std::vector<Engine::DecodeStepIn> steps;
      for (int32_t l : c.stepping) steps.push_back({l, tokens[static_cast<size_t>(l) + 1], lengths[l]});
      // Alone.
      std::vector<std::vector<float>> chunks_alone;
      for (const Engine::ChunkIn& ch : chunks) {
        if (!ch.logits) {
          ASSERT_TRUE(e->Prefill(ch.lane, ch.tokens, ch.pos).ok());
          chunks_alone.emplace_back();
          continue;
        }
        auto one = e->Decode(ch.lane, ch.tokens, ch.pos);
        ASSERT_TRUE(one.ok()) << one.status();
        chunks_alone.push_back(std::move(*one));
      }
      std::vector<std::vector<float>> steps_alone;
      for (const Engine::DecodeStepIn& s : steps) {
        auto one = e->DecodeStep(std::span(&s, 1));
        ASSERT_TRUE(one.ok()) << one.status();
        steps_alone.push_back((*one)[0]);
      }
      std::vector<std::vector<uint8_t>> state_alone;
      for (int32_t l = 0; l < 4; ++l) {
        auto bytes = e->ExportResident(l);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        state_alone.push_back(std::move(*bytes));
      }
      std::vector<Engine::DecodeStepIn> next;
      for (int32_t l = 0; l < 4; ++l) next.push_back({l, tokens[7], e->SequenceLength(l)});
      auto next_alone = e->DecodeStep(next);
      ASSERT_TRUE(next_alone.ok()) << next_alone.status();
      for (int32_t l = 0; l < 4; ++l) ASSERT_TRUE(e->Truncate(l, lengths[l]).ok());
      // Together.
      auto mixed = e->DecodeStepWithChunks(steps, chunks);
      ASSERT_TRUE(mixed.ok()) << mixed.status();
      ASSERT_EQ(mixed->chunks.size(), chunks.size());
      for (size_t i = 0; i < chunks.size(); ++i) {
        EXPECT_EQ(mixed->chunks[i].empty(), !chunks[i].logits);
        EXPECT_TRUE(env::SameBytes(mixed->chunks[i], chunks_alone[i])) << "lane " << chunks[i].lane << "'s chunk differs";
      }
      ASSERT_EQ(mixed->steps.size(), steps.size());
      for (size_t i = 0; i < steps.size(); ++i) {
        EXPECT_TRUE(env::SameBytes(mixed->steps[i], steps_alone[i])) << "lane " << steps[i].lane << "'s step differs";
      }
      for (int32_t l = 0; l < 4; ++l) {
        EXPECT_EQ(e->SequenceLength(l), next[static_cast<size_t>(l)].pos);
        auto bytes = e->ExportResident(l);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        EXPECT_TRUE(*bytes == state_alone[static_cast<size_t>(l)]) << "lane " << l << "'s exported state differs";
      }
      auto next_mixed = e->DecodeStep(next);
      ASSERT_TRUE(next_mixed.ok()) << next_mixed.status();
      for (size_t l = 0; l < 4; ++l) {
        EXPECT_TRUE(env::SameBytes((*next_mixed)[l], (*next_alone)[l])) << "lane " << l << "'s KV differs";
      }
    }
    auto check = skippy::certify::CheckStepWithChunk(*e, 0, 1, 2);
    ASSERT_TRUE(check.ok()) << check.status();
    EXPECT_TRUE(check->pass) << check->ToJson().dump();
  }
}

TEST(MixedSteps, EveryRowIsComputedAsAlone) {
  REQUIRE_RAGGED_SPLIT();
  for (const char* family : {"llama", "gemma3", "deepseek2"}) ExpectEveryRowAsAlone(family);
}

TEST(MixedSteps, EveryRowIsComputedAsAloneOnQuantizedWeights) {
  REQUIRE_RAGGED_SPLIT();
  for (const char* model : {"llama.Q4_K_M", "gemma3.Q4_K_M", "deepseek2.Q4_K_M"}) {
    ExpectEveryRowAsAlone(StrCat(SKIPPY_TEST_SMALL_ZOO_DIR, "/", model, ".gguf"));
  }
}

// Five lanes of unequal lengths; steps of lanes apart ({0, 2}, {1, 3, 4}, {4, 0, 2} in that order,
// {0, 1, 3}) against each lane's step alone; each lane's exported state (its family's payload),
// then a step of all lanes. Lanes are prefilled again before each run (a hybrid's recurrent state
// cannot be cut back). Then the startup check on lanes 0 and 2.
void ExpectLanesApartAsAlone(const std::string& model) {
  for (bool fa : {true, false}) {
    SCOPED_TRACE(StrCat(model, " flash_attn=", fa));
    std::atomic<uint64_t> graphs{0};
    auto e = Open(model, fa, 5, &graphs);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->CanStepLanesApart());
    const auto tokens = env::Tokens(*e, 400);
    const int32_t lengths[5] = {300, 37, 180, 5, 260};
    const auto payload = e->family().payload;
    auto export_state = [&](int32_t lane) {
      return payload == skippy::cache::PayloadKind::kResidentKv ? e->ExportResident(lane) : e->ExportState(lane, payload);
    };
    auto fill = [&] {
      for (int32_t l = 0; l < 5; ++l) {
        ASSERT_TRUE(e->Clear(l).ok());
        ASSERT_TRUE(e->Prefill(l, std::span(tokens).first(static_cast<size_t>(lengths[l])), 0).ok());
      }
    };
    const std::vector<std::vector<int32_t>> cases = {{0, 2}, {1, 3, 4}, {4, 0, 2}, {0, 1, 3}};
    for (const std::vector<int32_t>& lanes : cases) {
      SCOPED_TRACE(StrCat("lanes ", lanes.front(), "..", lanes.back(), " (", lanes.size(), ")"));
      std::vector<Engine::DecodeStepIn> steps;
      for (int32_t l : lanes) steps.push_back({l, tokens[static_cast<size_t>(l) + 1], lengths[l]});
      std::vector<Engine::DecodeStepIn> next;
      for (int32_t l = 0; l < 5; ++l) {
        const bool steps_first = std::find(lanes.begin(), lanes.end(), l) != lanes.end();
        next.push_back({l, tokens[7], lengths[l] + (steps_first ? 1 : 0)});
      }
      // Alone: each lane's step by itself.
      fill();
      std::vector<std::vector<float>> alone;
      for (const Engine::DecodeStepIn& s : steps) {
        auto one = e->DecodeStep(std::span(&s, 1));
        ASSERT_TRUE(one.ok()) << one.status();
        alone.push_back((*one)[0]);
      }
      std::vector<std::vector<uint8_t>> state_alone;
      for (int32_t l = 0; l < 5; ++l) {
        auto bytes = export_state(l);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        state_alone.push_back(std::move(*bytes));
      }
      auto next_alone = e->DecodeStep(next);
      ASSERT_TRUE(next_alone.ok()) << next_alone.status();
      // Together: one step of the lanes apart.
      fill();
      const uint64_t graphs_before = graphs.load();
      auto together = e->DecodeStep(steps);
      ASSERT_TRUE(together.ok()) << together.status();
      EXPECT_EQ(graphs.load() - graphs_before, 1u) << "lanes apart in one graph";
      ASSERT_EQ(together->size(), steps.size());
      for (size_t i = 0; i < steps.size(); ++i) {
        EXPECT_TRUE(env::SameBytes((*together)[i], alone[i])) << "lane " << steps[i].lane << "'s step differs";
      }
      for (int32_t l = 0; l < 5; ++l) {
        EXPECT_EQ(e->SequenceLength(l), next[static_cast<size_t>(l)].pos);
        auto bytes = export_state(l);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        EXPECT_TRUE(*bytes == state_alone[static_cast<size_t>(l)]) << "lane " << l << "'s exported state differs";
      }
      auto next_together = e->DecodeStep(next);
      ASSERT_TRUE(next_together.ok()) << next_together.status();
      for (size_t l = 0; l < 5; ++l) {
        EXPECT_TRUE(env::SameBytes((*next_together)[l], (*next_alone)[l])) << "lane " << l << "'s state differs";
      }
    }
    for (int32_t l = 0; l < 5; ++l) ASSERT_TRUE(e->Clear(l).ok());
    auto check = skippy::certify::CheckLaneBatching(*e, 0, 2);
    ASSERT_TRUE(check.ok()) << check.status();
    EXPECT_TRUE(check->pass) << check->ToJson().dump();
  }
}

TEST(RaggedSteps, LanesApartStepAsAlone) {
  REQUIRE_RAGGED_SPLIT();
  for (const char* family : {"llama", "gemma3", "deepseek2", "qwen3next", "falcon-h1"}) ExpectLanesApartAsAlone(family);
}

TEST(RaggedSteps, LanesApartStepAsAloneOnQuantizedWeights) {
  REQUIRE_RAGGED_SPLIT();
  for (const char* model : {"llama.Q4_K_M", "gemma3.Q4_K_M", "deepseek2.Q4_K_M", "qwen3next.Q4_K_M"}) {
    ExpectLanesApartAsAlone(StrCat(SKIPPY_TEST_SMALL_ZOO_DIR, "/", model, ".gguf"));
  }
}

// The graphs a DecodeStep of `lanes` (each appending `token`) computes, by `graphs`.
uint64_t GraphsOfStep(Engine& e, const std::atomic<uint64_t>& graphs, const std::vector<int32_t>& lanes, Token token) {
  std::vector<Engine::DecodeStepIn> steps;
  for (int32_t l : lanes) steps.push_back({l, token, e.SequenceLength(l)});
  const uint64_t before = graphs.load();
  auto r = e.DecodeStep(steps);
  EXPECT_TRUE(r.ok()) << r.status();
  return graphs.load() - before;
}

// One graph per step, counted (ContextOptions::graph_count): lanes apart, lanes that follow each
// other (in order or not), and a chunk beside steps are each one graph; the stock split (the one-row class off, pad
// rows) makes one graph per run of consecutive lanes, which shows the count counts.
TEST(RaggedSteps, AStepIsOneGraph) {
  REQUIRE_RAGGED_SPLIT();
  for (const char* family : {"llama", "gemma3", "deepseek2", "qwen3next"}) {
    SCOPED_TRACE(family);
    std::atomic<uint64_t> graphs{0};
    auto e = Open(family, /*flash_attn=*/true, 5, &graphs);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->CanStepLanesApart());
    const auto tokens = env::Tokens(*e, 40);
    for (int32_t l = 0; l < 5; ++l) ASSERT_TRUE(e->Prefill(l, std::span(tokens).first(static_cast<size_t>(8 + l)), 0).ok());
    auto graphs_for = [&](const std::vector<int32_t>& lanes) { return GraphsOfStep(*e, graphs, lanes, tokens[1]); };
    EXPECT_EQ(graphs_for({0, 2, 4}), 1u);
    EXPECT_EQ(graphs_for({4, 1}), 1u);
    EXPECT_EQ(graphs_for({3, 2}), 1u) << "lanes that follow each other, out of order";
    EXPECT_EQ(graphs_for({1, 2, 3}), 1u);
    EXPECT_EQ(graphs_for({0, 1, 2, 3, 4}), 1u);
    if (e->CanStepWithChunk()) {
      const std::vector<Engine::DecodeStepIn> steps = {{0, tokens[1], e->SequenceLength(0)},
                                                       {4, tokens[1], e->SequenceLength(4)}};
      const uint64_t before = graphs.load();
      const Engine::ChunkIn chunk{2, std::span(tokens).subspan(20, 7), e->SequenceLength(2), true};
      auto r = e->DecodeStepWithChunks(steps, std::span(&chunk, 1));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(graphs.load() - before, 1u) << "a chunk of 7 rows beside two steps";
      const Engine::ChunkIn chunks[] = {{3, std::span(tokens).subspan(20, 5), e->SequenceLength(3), true},
                                        {1, std::span(tokens).subspan(20, 9), e->SequenceLength(1), false}};
      const uint64_t before_two = graphs.load();
      auto two = e->DecodeStepWithChunks({}, chunks);
      ASSERT_TRUE(two.ok()) << two.status();
      EXPECT_EQ(graphs.load() - before_two, 1u) << "chunks of 5 and 9 rows into lanes 3 and 1";
    }
  }
  ASSERT_TRUE(skippy::runtime::SetOneRowClass(false));
  std::atomic<uint64_t> graphs{0};
  auto e = Open("llama", /*flash_attn=*/true, 5, &graphs);
  ASSERT_NE(e, nullptr);
  ASSERT_FALSE(e->CanStepLanesApart());
  const auto tokens = env::Tokens(*e, 40);
  for (int32_t l = 0; l < 5; ++l) ASSERT_TRUE(e->Prefill(l, std::span(tokens).first(8), 0).ok());
  auto graphs_for = [&](const std::vector<int32_t>& lanes) { return GraphsOfStep(*e, graphs, lanes, tokens[1]); };
  EXPECT_EQ(graphs_for({0, 2, 4}), 3u) << "the stock split: one graph per run";
  EXPECT_EQ(graphs_for({0, 1, 3}), 2u);
  EXPECT_EQ(graphs_for({1, 2, 3}), 1u);
}

// Bad steps are refused before llama.cpp sees them, and leave every lane as it was.
TEST(MixedSteps, RefusesWhatItCannotStep) {
  REQUIRE_RAGGED_SPLIT();
  auto e = Open("llama", /*flash_attn=*/true, 3);
  ASSERT_NE(e, nullptr);
  const auto tokens = env::Tokens(*e, 600);
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(e->Prefill(l, std::span(tokens).first(10), 0).ok());
  const std::span<const Token> chunk = std::span(tokens).subspan(10, 8);
  const Engine::DecodeStepIn step1{1, tokens[1], 10}, step2{2, tokens[1], 10};
  auto refused = [&](std::vector<Engine::DecodeStepIn> steps, std::vector<Engine::ChunkIn> chunks) {
    auto r = e->DecodeStepWithChunks(steps, chunks);
    EXPECT_FALSE(r.ok());
    for (int32_t l = 0; l < 3; ++l) EXPECT_EQ(e->SequenceLength(l), 10) << "lane " << l << " changed";
    return r.ok() ? absl::OkStatus() : r.status();
  };
  const Engine::ChunkIn c0{0, chunk, 10, true};
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1}, {})));                                // no chunk
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1}, {{0, {}, 10, true}})));               // empty chunk
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1}, {c0, {2, {}, 10, true}})));           // one empty of two
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1}, {{1, chunk, 10, true}})));            // a lane twice
  EXPECT_TRUE(absl::IsInvalidArgument(refused({}, {c0, {0, chunk, 10, true}})));             // a chunk lane twice
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1, step1}, {c0})));                       // a step twice
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1}, {{0, chunk, 9, true}})));             // not an append
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1}, {c0, {2, chunk, 11, true}})));        // not an append
  EXPECT_TRUE(absl::IsInvalidArgument(refused({{2, tokens[1], 11}}, {c0})));                 // not an append
  EXPECT_TRUE(absl::IsInvalidArgument(refused({{7, tokens[1], 10}}, {c0})));                 // no such lane
  EXPECT_TRUE(absl::IsInvalidArgument(refused({}, {c0, {7, chunk, 10, true}})));             // no such lane
  EXPECT_TRUE(absl::IsInvalidArgument(refused({{2, -5, 10}}, {c0})));                        // a bad token
  const uint32_t n_ubatch = e->context().options().n_ubatch;
  const std::span<const Token> too_long = std::span(tokens).subspan(10, n_ubatch);
  EXPECT_TRUE(absl::IsInvalidArgument(refused({step1, step2}, {{0, too_long, 10, false}})));  // past the ubatch
  const std::span<const Token> half = std::span(tokens).subspan(10, n_ubatch / 2 + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(refused({}, {{0, half, 10, false}, {1, half, 10, false}})));  // two past it
  // And then good ones go through: a chunk beside two steps, and two chunks alone.
  const Engine::ChunkIn quiet{0, chunk, 10, false};
  auto ok = e->DecodeStepWithChunks(std::vector{step1, step2}, std::span(&quiet, 1));
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->chunks.size(), 1u);
  EXPECT_TRUE(ok->chunks[0].empty());
  EXPECT_EQ(ok->steps.size(), 2u);
  EXPECT_EQ(e->SequenceLength(0), 18);
  EXPECT_EQ(e->SequenceLength(1), 11);
  const Engine::ChunkIn two[] = {{2, chunk, 11, true}, {1, chunk, 11, false}};
  auto ok_two = e->DecodeStepWithChunks({}, two);
  ASSERT_TRUE(ok_two.ok()) << ok_two.status();
  ASSERT_EQ(ok_two->chunks.size(), 2u);
  EXPECT_FALSE(ok_two->chunks[0].empty());
  EXPECT_TRUE(ok_two->chunks[1].empty());
  EXPECT_TRUE(ok_two->steps.empty());
  EXPECT_EQ(e->SequenceLength(2), 19);
  EXPECT_EQ(e->SequenceLength(1), 19);
}

// Hybrids keep their decode rows apart from chunks (their recurrent ops need equal runs).
TEST(MixedSteps, HybridsDoNotStepBesideAChunk) {
  REQUIRE_RAGGED_SPLIT();
  auto e = Open("qwen3next", /*flash_attn=*/true, 2);
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(e->CanStepWithChunk());
  const auto tokens = env::Tokens(*e, 20);
  ASSERT_TRUE(e->Prefill(0, std::span(tokens).first(10), 0).ok());
  ASSERT_TRUE(e->Prefill(1, std::span(tokens).first(10), 0).ok());
  const Engine::DecodeStepIn step{1, tokens[1], 10};
  const Engine::ChunkIn chunk{0, std::span(tokens).subspan(10, 4), 10, true};
  auto r = e->DecodeStepWithChunks(std::span(&step, 1), std::span(&chunk, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_EQ(e->SequenceLength(0), 10);
  auto check = skippy::certify::CheckStepWithChunk(*e, 0, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(check.status())) << check.status();
}

}  // namespace
