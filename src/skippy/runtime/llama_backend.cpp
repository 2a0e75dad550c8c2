#include "skippy/runtime/llama_backend.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>

#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

#ifndef SKIPPY_LLAMA_COMMIT
#define SKIPPY_LLAMA_COMMIT "unknown"
#endif
#ifndef SKIPPY_LLAMA_PATCHES
#define SKIPPY_LLAMA_PATCHES "none"
#endif

namespace skippy::runtime {
namespace {

std::mutex g_mu;
std::deque<std::string> g_tail;  // guarded by g_mu
bool g_verbose = false;
std::mutex g_switch_mu;
bool g_invariant_chosen = false;  // guarded by g_switch_mu

void LogRouter(ggml_log_level level, const char* text, void*) {
  if (g_verbose) std::fputs(text, stderr);
  if (level != GGML_LOG_LEVEL_ERROR && level != GGML_LOG_LEVEL_WARN) return;
  std::lock_guard<std::mutex> lock(g_mu);
  std::string line(text);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.empty()) return;
  g_tail.push_back(std::move(line));
  while (g_tail.size() > 8) g_tail.pop_front();
}

// The patch series' switch, looked up at run time so that a stock build still links and runs.
using SetFn = void (*)(bool);
using GetFn = bool (*)();
struct InvariantSwitch {
  SetFn set = nullptr;
  GetFn get = nullptr;
  SetFn set_one_row = nullptr;  // absent in builds of an older patch series
  GetFn get_one_row = nullptr;
};

const InvariantSwitch& Switch() {
  static const InvariantSwitch s = [] {
    InvariantSwitch out;
    out.set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "ggml_cpu_set_batch_invariant"));
    out.get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "ggml_cpu_get_batch_invariant"));
    out.set_one_row = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "ggml_cpu_set_batch_invariant_one_row"));
    out.get_one_row = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "ggml_cpu_get_batch_invariant_one_row"));
    if (out.set_one_row == nullptr || out.get_one_row == nullptr) {
      out.set_one_row = nullptr;
      out.get_one_row = nullptr;
    }
    if (out.set == nullptr || out.get == nullptr) out = {};
    return out;
  }();
  return s;
}

}  // namespace

bool BatchInvariantAvailable() { return Switch().set != nullptr; }

// On unless a caller chose first (SetBatchInvariant): applied at the first EnsureLlamaBackend or
// BatchInvariant, whichever comes first, so rules derived from the mode agree before and after
// the first model loads. The choice and the default are made under one lock, so a concurrent
// SetBatchInvariant is never overwritten by the default.
static void ApplyDefaultOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::lock_guard<std::mutex> lock(g_switch_mu);
    if (!g_invariant_chosen && BatchInvariantAvailable()) Switch().set(true);
  });
}

bool SetBatchInvariant(bool on) {
  if (!BatchInvariantAvailable()) return false;
  std::lock_guard<std::mutex> lock(g_switch_mu);
  g_invariant_chosen = true;
  Switch().set(on);
  return true;
}

bool BatchInvariant() {
  ApplyDefaultOnce();
  return BatchInvariantAvailable() && Switch().get();
}

bool OneRowClassAvailable() { return Switch().set_one_row != nullptr; }

bool SetOneRowClass(bool on) {
  if (!OneRowClassAvailable()) return false;
  std::lock_guard<std::mutex> lock(g_switch_mu);
  Switch().set_one_row(on);
  return true;
}

bool OneRowClass() { return BatchInvariant() && OneRowClassAvailable() && Switch().get_one_row(); }

namespace {
SetFn RaggedSwitch() {
  static const SetFn set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "llama_batch_set_ragged_split"));
  return set;
}
}  // namespace

bool RaggedSplitAvailable() { return RaggedSwitch() != nullptr; }

ScopedRaggedSplit::ScopedRaggedSplit() : on_(RaggedSplitAvailable()) {
  if (on_) RaggedSwitch()(true);
}

ScopedRaggedSplit::~ScopedRaggedSplit() {
  if (on_) RaggedSwitch()(false);
}

std::string CpuKernelFeatures() {
  struct Feature {
    const char* name;
    int (*has)();
  };
  static const Feature kFeatures[] = {
      {"sse3", ggml_cpu_has_sse3},       {"ssse3", ggml_cpu_has_ssse3},
      {"avx", ggml_cpu_has_avx},         {"avx_vnni", ggml_cpu_has_avx_vnni},
      {"avx2", ggml_cpu_has_avx2},       {"bmi2", ggml_cpu_has_bmi2},
      {"f16c", ggml_cpu_has_f16c},       {"fma", ggml_cpu_has_fma},
      {"avx512", ggml_cpu_has_avx512},   {"avx512_vbmi", ggml_cpu_has_avx512_vbmi},
      {"avx512_vnni", ggml_cpu_has_avx512_vnni}, {"avx512_bf16", ggml_cpu_has_avx512_bf16},
      {"amx_int8", ggml_cpu_has_amx_int8}, {"neon", ggml_cpu_has_neon},
      {"arm_fma", ggml_cpu_has_arm_fma}, {"fp16_va", ggml_cpu_has_fp16_va},
      {"dotprod", ggml_cpu_has_dotprod}, {"matmul_int8", ggml_cpu_has_matmul_int8},
      {"sve", ggml_cpu_has_sve},         {"sme", ggml_cpu_has_sme},
      {"riscv_v", ggml_cpu_has_riscv_v}, {"vsx", ggml_cpu_has_vsx},
      {"vxe", ggml_cpu_has_vxe},         {"llamafile", ggml_cpu_has_llamafile},
  };
  std::string out;
  for (const Feature& f : kFeatures) {
    if (f.has() != 0) out += std::string(out.empty() ? "" : ",") + f.name;
  }
  // The patch series' switch back to the IQ types' stock kernels (read once by ggml).
  if (std::getenv("GGML_NO_IQ_PANEL") != nullptr) out += ",no-iq-panel";
  return out;
}

std::string KernelBuild() {
  return std::string(SKIPPY_LLAMA_COMMIT) + "+patches:" + SKIPPY_LLAMA_PATCHES + "+cpu:" + CpuKernelFeatures() +
         (BatchInvariant() ? "+batch-invariant" : "");
}

void EnsureLlamaBackend() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("SKIPPY_LLAMA_LOG");
    g_verbose = env != nullptr && env[0] == '1';
    llama_log_set(LogRouter, nullptr);
    llama_backend_init();
    ApplyDefaultOnce();
  });
}

std::string TakeLlamaLogTail() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string out;
  for (const std::string& l : g_tail) {
    if (!out.empty()) out += "; ";
    out += l;
  }
  g_tail.clear();
  return out;
}

}  // namespace skippy::runtime
