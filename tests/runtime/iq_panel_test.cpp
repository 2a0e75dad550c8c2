// The patch series' IQ panel (iqp.cpp) decodes eight weight rows of an IQ type into an int8 panel
// for a batch's products. In the batch-invariant mode it decodes IQ2_XS with its own vector code
// on CPUs with AVX-512 (VBMI, BITALG, VNNI), where the stock mode keeps the row-by-row decoders.
// Both must write the same panel, or the mode would change the model's weights, not only where
// batches are cut, and the batch-split proofs would not see it (they compare the mode with
// itself). Checked through a whole product: eight activation rows take the panel in both modes
// and its GEMM adds in one order, so any byte of the panel that differs shows in the outputs.
// On CPUs without those extensions both modes run the row decoders and the test only checks that.
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

// y = W x for n-wide IQ2_XS rows and 8 activation rows, computed with the mode as it is set
std::vector<float> Product(const std::vector<uint8_t>& wq, int n, int rows, const std::vector<float>& x, int cols) {
  ggml_init_params params{};
  params.mem_size = 64u << 20;
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* w = ggml_new_tensor_2d(ctx, GGML_TYPE_IQ2_XS, n, rows);
  ggml_tensor* a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, cols);
  std::memcpy(w->data, wq.data(), wq.size());
  std::memcpy(a->data, x.data(), x.size() * sizeof(float));
  ggml_tensor* y = ggml_mul_mat(ctx, w, a);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, y);
  EXPECT_EQ(ggml_graph_compute_with_ctx(ctx, graph, 2), GGML_STATUS_SUCCESS);
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  std::memcpy(out.data(), y->data, out.size() * sizeof(float));
  ggml_free(ctx);
  return out;
}

TEST(IqPanel, TheBatchInvariantDecodeWritesTheStockPanel) {
  if (std::string(SKIPPY_TEST_LLAMA_PATCHES) == "none") GTEST_SKIP() << "llama.cpp built without the patch series";
  ASSERT_TRUE(skippy::runtime::BatchInvariantAvailable());
  skippy::runtime::EnsureLlamaBackend();  // ggml_cpu_init: the F16 tables the kernels read

  constexpr int kCols = 8;  // the stock mode's smallest batch for the panel
  for (const int n : {256, 768, 2816}) {  // one super-block; the bench zoo's hidden and ffn widths
    const int rows = 64;
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n) * rows), x(static_cast<size_t>(n) * kCols);
    for (float& v : w) v = normal(rng);
    for (float& v : x) v = normal(rng);
    const std::vector<float> importance(n, 1.0f);  // IQ2_XS quantization requires one
    std::vector<uint8_t> wq(ggml_row_size(GGML_TYPE_IQ2_XS, n) * rows);
    ggml_quantize_chunk(GGML_TYPE_IQ2_XS, w.data(), wq.data(), 0, rows, n, importance.data());

    ASSERT_TRUE(skippy::runtime::SetBatchInvariant(false));
    const std::vector<float> stock = Product(wq, n, rows, x, kCols);
    ASSERT_TRUE(skippy::runtime::SetBatchInvariant(true));
    const std::vector<float> invariant = Product(wq, n, rows, x, kCols);

    int differ = 0, nonzero = 0;
    for (size_t i = 0; i < stock.size(); ++i) {
      nonzero += stock[i] != 0.0f;
      if (std::memcmp(&stock[i], &invariant[i], sizeof(float)) != 0 && ++differ <= 3) {
        ADD_FAILURE() << "n=" << n << " output " << i << ": " << invariant[i] << " in the batch-invariant mode, " << stock[i]
                      << " in the stock one";
      }
    }
    EXPECT_EQ(differ, 0) << "n=" << n;
    EXPECT_GT(nonzero, static_cast<int>(stock.size()) / 2) << "n=" << n << ": mostly zero products prove little";
  }
}

}  // namespace
