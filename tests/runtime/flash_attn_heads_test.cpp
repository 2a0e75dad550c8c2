// Flash attention's tiled path in the batch-invariant mode of the patch series: a tile holds the
// query heads that read one K and V head, a block of heads times a block of rows, so that a K and
// V tile is converted once for all of them. Which heads and rows share a tile must change no bits:
// a row's result must be the stock tiled path's (a tile per head, batches of 64+ rows), and the
// same in a batch of any size (every batch one class), whatever the thread count (which sets the
// blocks). Checked on the op itself, with grouped-query shapes of the bench zoo (Llama's 16 heads
// on 4, Gemma3's 4 on 1, DeepSeek2's multi-latent 8 on 1 with a wider K than V), 14 heads on 2
// (blocks of heads that do not divide a KV head's 7, and with many threads one head and one row
// per tile), a causal mask, and what is per head: ALiBi slopes, a mask of its own, attention
// sinks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"
#include "skippy/runtime/llama_backend.h"

namespace {

struct Shape {
  const char* name;
  int dk, dv, heads, kv_heads;
  float max_bias = 0.0f, softcap = 0.0f;
  bool mask_per_head = false;  // each head sees a different number of cells
  bool sinks = false;          // a sink logit per head
};

constexpr int kCells = 300;    // KV cells: four tiles of 64 and a partial one
constexpr int kMaxRows = 100;  // query rows of the longest batch
constexpr int kFirstSeen = kCells - kMaxRows;  // row r sees cells [0, kFirstSeen + r]

struct Inputs {
  std::vector<float> q;       // [kMaxRows][heads][dk]: row r, head h
  std::vector<uint16_t> k;    // [kv_heads][kCells][dk] F16
  std::vector<uint16_t> v;    // [kv_heads][kCells][dv] F16
};

Inputs MakeInputs(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs in;
  in.q.resize(static_cast<size_t>(kMaxRows) * s.heads * s.dk);
  for (float& x : in.q) x = normal(rng);
  in.k.resize(static_cast<size_t>(s.kv_heads) * kCells * s.dk);
  for (uint16_t& x : in.k) x = ggml_fp32_to_fp16(normal(rng));
  in.v.resize(static_cast<size_t>(s.kv_heads) * kCells * s.dv);
  for (uint16_t& x : in.v) x = ggml_fp32_to_fp16(normal(rng));
  return in;
}

// The attention of the first `rows` query rows, out[r][h][dv], computed with the modes as set.
std::vector<float> Attend(const Shape& s, const Inputs& in, int rows, int threads) {
  ggml_init_params params{};
  params.mem_size = 256u << 20;
  ggml_context* ctx = ggml_init(params);
  // q is [dk, rows, heads] in ggml's order (ne0 fastest); the inputs hold row-major [r][h][dk]
  ggml_tensor* q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, s.dk, rows, s.heads);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < s.heads; ++h) {
      std::memcpy(static_cast<char*>(q->data) + r * q->nb[1] + h * q->nb[2],
                  in.q.data() + (static_cast<size_t>(r) * s.heads + h) * s.dk, s.dk * sizeof(float));
    }
  }
  ggml_tensor* k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, s.dk, kCells, s.kv_heads);
  std::memcpy(k->data, in.k.data(), in.k.size() * sizeof(uint16_t));
  ggml_tensor* v = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, s.dv, kCells, s.kv_heads);
  std::memcpy(v->data, in.v.data(), in.v.size() * sizeof(uint16_t));
  const int mask_heads = s.mask_per_head ? s.heads : 1;
  ggml_tensor* mask = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, kCells, rows, mask_heads);
  auto* m = static_cast<ggml_fp16_t*>(mask->data);
  for (int h = 0; h < mask_heads; ++h) {
    for (int r = 0; r < rows; ++r) {
      // with a mask per head, head h sees 70 * (h % 4) fewer cells: whole KV tiles masked for some
      // heads, all cells for the first rows of some
      const int last = kFirstSeen + r - 70 * (h % 4);
      for (int c = 0; c < kCells; ++c) {
        m[(static_cast<size_t>(h) * rows + r) * kCells + c] = ggml_fp32_to_fp16(c <= last ? 0.0f : -INFINITY);
      }
    }
  }
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.125f, s.max_bias, s.softcap);
  ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
  if (s.sinks) {
    ggml_tensor* sinks = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, s.heads);
    for (int h = 0; h < s.heads; ++h) static_cast<float*>(sinks->data)[h] = 0.5f * static_cast<float>(h) - 1.0f;
    ggml_flash_attn_ext_add_sinks(out, sinks);
  }
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  EXPECT_EQ(ggml_graph_compute_with_ctx(ctx, graph, threads), GGML_STATUS_SUCCESS);
  // out is [dv, heads, rows]: already [r][h][dv] in memory
  std::vector<float> result(static_cast<size_t>(rows) * s.heads * s.dv);
  std::memcpy(result.data(), out->data, result.size() * sizeof(float));
  ggml_free(ctx);
  return result;
}

// How many floats of `got` differ in their bits from the same positions of `want` (a prefix of it).
int Differ(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  int differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0 && ++differ <= 3) {
      ADD_FAILURE() << what << ", output " << i << ": " << got[i] << " != " << want[i];
    }
  }
  return differ;
}

class FlashAttnHeads : public ::testing::Test {
 protected:
  void TearDown() override {
    skippy::runtime::SetOneRowClass(false);
    skippy::runtime::SetBatchInvariant(true);
  }
};

TEST_F(FlashAttnHeads, HeadsOfOneKvHeadShareATileWithTheBitsOfATilePerHead) {
  if (std::string(SKIPPY_TEST_LLAMA_PATCHES) == "none") GTEST_SKIP() << "llama.cpp built without the patch series";
  ASSERT_TRUE(skippy::runtime::BatchInvariantAvailable());
  ASSERT_TRUE(skippy::runtime::OneRowClassAvailable());
  skippy::runtime::EnsureLlamaBackend();  // ggml_cpu_init: the F16 tables the kernels read

  const Shape shapes[] = {
      {"llama 16 on 4", 64, 64, 16, 4},
      {"gemma3 4 on 1", 256, 256, 4, 1},
      {"deepseek2 8 on 1, dk 288", 288, 256, 8, 1},
      {"alibi and softcap, 8 on 2", 64, 64, 8, 2, 8.0f, 30.0f},
      {"14 on 2, a mask per head, sinks", 64, 64, 14, 2, 0.0f, 0.0f, true, true},
      {"no grouping, 4 on 4", 64, 64, 4, 4},
  };
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.name);
    const Inputs in = MakeInputs(s, seed++);

    // 64+ rows: the stock kernel's tiled path, a tile per head, against the mode's shared tiles.
    ASSERT_TRUE(skippy::runtime::SetBatchInvariant(false));
    const std::vector<float> stock = Attend(s, in, kMaxRows, 2);
    const std::vector<float> stock64 = Attend(s, in, 64, 2);
    ASSERT_TRUE(skippy::runtime::SetBatchInvariant(true));
    ASSERT_TRUE(skippy::runtime::SetOneRowClass(true));
    int nonzero = 0;
    for (float x : stock) nonzero += x != 0.0f;
    EXPECT_GT(nonzero, static_cast<int>(stock.size()) / 2) << "mostly zero outputs prove little";
    for (int threads : {1, 2, 3}) {
      EXPECT_EQ(Differ(stock, Attend(s, in, kMaxRows, threads), "100 rows, " + std::to_string(threads) + " threads"), 0);
      EXPECT_EQ(Differ(stock64, Attend(s, in, 64, threads), "64 rows, " + std::to_string(threads) + " threads"), 0);
    }
    // Shorter batches, one row too (the one-row class): each row as in the longest batch.
    for (int rows : {1, 2, 3, 5, 8, 16, 33}) {
      for (int threads : {1, 2, 3, 8}) {
        const std::string what = std::to_string(rows) + " rows, " + std::to_string(threads) + " threads";
        EXPECT_EQ(Differ(stock, Attend(s, in, rows, threads), what), 0);
      }
    }
  }
}

}  // namespace
