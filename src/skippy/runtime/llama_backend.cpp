#include "skippy/runtime/llama_backend.h"

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>

#include "ggml.h"
#include "llama.h"

namespace skippy::runtime {
namespace {

std::mutex g_mu;
std::deque<std::string> g_tail;  // guarded by g_mu
bool g_verbose = false;

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

}  // namespace

void EnsureLlamaBackend() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("SKIPPY_LLAMA_LOG");
    g_verbose = env != nullptr && env[0] == '1';
    llama_log_set(LogRouter, nullptr);
    llama_backend_init();
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
