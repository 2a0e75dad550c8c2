// The patch series' Q6_K column kernel (ggml_vec_dot_q6_K_q8_K_cols, x86 AVX2): each of up to
// eight columns must get the bits of the one-row dot product, which is what lets the
// batch-invariant mode multiply several rows of a batch at once without a row's result depending
// on its batch. The model-level proof is the batch-split tests on the Q4_K_M small zoo (their
// output projections and some ffn_down matrices are Q6_K); this one checks the kernel directly,
// over many random rows, where a one-ulp slip in one column would show.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml.h"
#include "skippy/runtime/llama_backend.h"

namespace {

using DotFn = void (*)(int n, float* s, size_t bs, const void* vx, size_t bx, const void* vy, size_t by, int nrc);
using ColsFn = void (*)(int n, float* s, size_t bs, const void* vx, const void* const* vy, int ncols);
using QuantizeQ8KFn = void (*)(const float* x, void* y, int64_t k);

bool HasAvx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

TEST(Q6KColumns, EveryColumnGetsTheOneRowBits) {
  if (std::string(SKIPPY_TEST_LLAMA_PATCHES) == "none") GTEST_SKIP() << "llama.cpp built without the patch series";
  if (!HasAvx2()) GTEST_SKIP() << "the Q6_K column kernel is x86 AVX2 only";
  skippy::runtime::EnsureLlamaBackend();  // ggml_cpu_init: the F16 tables the kernels read
  const auto one_row = reinterpret_cast<DotFn>(dlsym(RTLD_DEFAULT, "ggml_vec_dot_q6_K_q8_K"));
  const auto cols = reinterpret_cast<ColsFn>(dlsym(RTLD_DEFAULT, "ggml_vec_dot_q6_K_q8_K_cols"));
  const auto quantize_q8_K = reinterpret_cast<QuantizeQ8KFn>(dlsym(RTLD_DEFAULT, "quantize_row_q8_K"));
  ASSERT_NE(one_row, nullptr);
  ASSERT_NE(quantize_q8_K, nullptr);
  ASSERT_NE(cols, nullptr) << "the patched libggml-cpu has no ggml_vec_dot_q6_K_q8_K_cols";

  constexpr int kMaxCols = 8;
  constexpr int kRows = 512;
  for (const int n : {256, 1024, 2816}) {  // one super block; the zoo's hidden and ffn widths
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n) * kRows), a(static_cast<size_t>(n) * kMaxCols);
    for (float& v : w) v = normal(rng);
    for (float& v : a) v = 4.0f * normal(rng);
    const size_t w_row = ggml_row_size(GGML_TYPE_Q6_K, n), a_row = ggml_row_size(GGML_TYPE_Q8_K, n);
    std::vector<uint8_t> wq(w_row * kRows), aq(a_row * kMaxCols);
    ggml_quantize_chunk(GGML_TYPE_Q6_K, w.data(), wq.data(), 0, kRows, n, nullptr);
    const void* columns[kMaxCols];
    for (int c = 0; c < kMaxCols; ++c) {
      quantize_q8_K(a.data() + static_cast<size_t>(c) * n, aq.data() + c * a_row, n);
      columns[c] = aq.data() + c * a_row;
    }

    int differ = 0, nonzero = 0;
    for (int ncols = 1; ncols <= kMaxCols; ++ncols) {
      for (int r = 0; r < kRows; ++r) {
        const void* row = wq.data() + r * w_row;
        float got[kMaxCols * 3];
        cols(n, got, 3, row, columns, ncols);  // a stride, to check that s[c*bs] is where c goes
        for (int c = 0; c < ncols; ++c) {
          float want = 0.0f;
          one_row(n, &want, 0, row, 0, columns[c], 0, 1);
          nonzero += want != 0.0f;
          if (std::memcmp(&want, &got[c * 3], sizeof(float)) != 0) {
            if (++differ <= 3) ADD_FAILURE() << "n=" << n << " ncols=" << ncols << " row " << r << " column " << c << ": " << got[c * 3] << " != " << want;
          }
        }
      }
    }
    EXPECT_EQ(differ, 0) << "n=" << n;
    EXPECT_GT(nonzero, kRows * kMaxCols) << "n=" << n << ": the products were mostly zero, so the comparison proves little";
  }
}

}  // namespace
