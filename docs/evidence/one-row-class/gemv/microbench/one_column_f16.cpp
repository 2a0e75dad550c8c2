#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include "ggml.h"
#include "ggml-cpu.h"
extern "C" {
void ggml_cpu_set_batch_invariant(bool enable);
void ggml_cpu_set_batch_invariant_one_row(bool enable);

}
int main(int argc, char** argv) {
  int k = atoi(argv[1]), m = atoi(argv[2]), iters = atoi(argv[3]); const int copies = std::max<int>(1, int((300ll << 20) / (int64_t(k) * m * 2)));
  // variants: "v:pf" pairs after argv[3]; "s" = stock
  ggml_init_params ip{size_t(k) * m * 2 * copies + size_t(m) * copies * 4 + size_t(k) * 4 * 8 + size_t(m) * 8 * 4 + (64 << 20), nullptr, false};
  ggml_context* ctx = ggml_init(ip);
  ggml_tensor* a = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, k, m);
  ggml_tensor* b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 1);
  ggml_tensor* b2 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 3);
  srand(7);
  auto* ad = (ggml_fp16_t*)a->data;
  for (int64_t i = 0; i < int64_t(k) * m; ++i) ad[i] = ggml_fp32_to_fp16((rand() / (float)RAND_MAX - 0.5f) * 0.1f);
  for (int64_t i = 0; i < k; ++i) ((float*)b->data)[i] = ((float*)b2->data)[i] = (rand() / (float)RAND_MAX - 0.5f);
  for (int64_t i = k; i < 3 * k; ++i) ((float*)b2->data)[i] = 0.25f;
  ggml_tensor* c = ggml_mul_mat(ctx, a, b);
  std::vector<ggml_tensor*> cs;
  for (int i = 1; i < copies; ++i) {
    ggml_tensor* ai = ggml_dup_tensor(ctx, a);
    memcpy(ai->data, a->data, ggml_nbytes(a));
    cs.push_back(ggml_mul_mat(ctx, ai, b));
  }
  ggml_tensor* c2 = ggml_mul_mat(ctx, a, b2);
  ggml_cgraph* gf = ggml_new_graph_custom(ctx, 4096, false);
  ggml_build_forward_expand(gf, c);
  for (ggml_tensor* x : cs) ggml_build_forward_expand(gf, x);
  ggml_cgraph* gf2 = ggml_new_graph_custom(ctx, 4096, false);
  ggml_build_forward_expand(gf2, c2);
  ggml_cpu_set_batch_invariant(true);
  ggml_cpu_set_batch_invariant_one_row(true);
  ggml_graph_compute_with_ctx(ctx, gf2, 2);
  std::vector<float> ref((float*)c2->data, (float*)c2->data + m);
  int nv = argc - 4;
  std::vector<std::vector<double>> t(nv);
  for (int it = 0; it < iters; ++it) {
    for (int j = 0; j < nv; ++j) {
      const char* spec = argv[4 + j];
      bool stock = spec[0] == 's';
      ggml_cpu_set_batch_invariant(!stock);
      ggml_cpu_set_batch_invariant_one_row(!stock);
      
      auto t0 = std::chrono::steady_clock::now();
      ggml_graph_compute_with_ctx(ctx, gf, 2);
      t[j].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      if (!stock && it == 0 && memcmp(c->data, ref.data(), m * 4) != 0) printf("%s: BITS DIFFER from a 3-column batch\n", spec);
    }
  }
  for (int j = 0; j < nv; ++j) {
    std::sort(t[j].begin(), t[j].end());
    printf("%-8s median %8.1f us  p10 %8.1f (per product, %d copies)\n", argv[4 + j], t[j][t[j].size() / 2] / copies, t[j][t[j].size() / 10] / copies, copies);
  }
}
