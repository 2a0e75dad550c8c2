// skippy-zoo: writes the synthetic model zoo (one GGUF per family) or lists it.
//
//   skippy-zoo --list
//   skippy-zoo --preset tiny --out DIR [--family KEY ...] [--force]
//
// DIR/manifest.json records, per family, the file, its size, parameter count and the spec digest
// that produced it. A family whose file exists with a matching digest and size is not rewritten,
// so repeated calls (tests, the benchmark wrapper) are cheap and a stale or truncated file is
// regenerated.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "skippy/runtime/synthetic_model.h"
#include "skippy/zoo/zoo_spec.h"

namespace fs = std::filesystem;
using nlohmann::json;
using skippy::zoo::FamilySpec;
using skippy::zoo::Preset;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;

// Parameter counts for --list use the tokenizer sizes of the vocab files the families copy.
uint64_t VocabSizeGuess(std::string_view vocab) {
  if (vocab == "qwen2") return 151936;
  if (vocab == "llama-bpe") return 128256;
  if (vocab == "gemma-4") return 262144;
  if (vocab == "deepseek-llm") return 102400;
  if (vocab == "gpt-neox") return 50277;
  if (vocab == "gpt-2") return 50257;
  if (vocab == "falcon") return 65024;
  return 0;
}

void List() {
  std::printf("%-12s %-14s %-10s %-8s %-14s %8s %8s %8s  %s\n", "family", "name", "arch", "memory", "payload",
              "tiny", "bench", "real", "tokenizer");
  for (const FamilySpec& f : skippy::zoo::Families()) {
    auto fmt = [&](Preset p) -> std::string {
      auto d = skippy::zoo::DimsFor(f, p);
      if (!d.ok()) return "-";
      const double n = static_cast<double>(skippy::zoo::ApproxParameterCount(f, *d, VocabSizeGuess(f.vocab)));
      return n >= 1e9 ? absl::StrFormat("%.2fB", n / 1e9) : absl::StrFormat("%.1fM", n / 1e6);
    };
    std::printf("%-12s %-14s %-10s %-8s %-14s %8s %8s %8s  %s%s\n", std::string(f.key).c_str(),
                std::string(f.display_name()).c_str(), std::string(f.arch()).c_str(),
                std::string(skippy::cache::MemoryKindName(f.row().memory)).c_str(),
                std::string(skippy::cache::PayloadKindName(f.row().payload)).c_str(),
                fmt(Preset::kTiny).c_str(), fmt(Preset::kBench).c_str(), fmt(Preset::kReal).c_str(),
                std::string(f.vocab).c_str(), f.vocab_note.empty() ? "" : " (stand-in)");
  }
  std::printf("\nParameter counts are approximate (from the dims; the manifest has exact counts).\n"
              "Presets: tiny (tests), bench (benchmarks), real (real hyperparameters, where they fit).\n"
              "All weights are synthetic: deterministic random values, not a trained model.\n");
}

json LoadManifest(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return json::object();
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return json::object();
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"skippy-zoo: write the synthetic model zoo (one GGUF per model family)"};
  bool list = false;
  std::string preset_name = "tiny";
  std::string out_dir;
  std::vector<std::string> families;
  std::string vocab_dir = SKIPPY_DEFAULT_VOCAB_DIR;
  bool force = false;
  app.add_flag("--list", list, "list families, architectures, presets and parameter counts");
  app.add_option("--preset", preset_name, "tiny | bench | real")->capture_default_str();
  app.add_option("--out", out_dir, "output directory");
  app.add_option("--family", families, "only these family keys (repeatable); default: all");
  app.add_option("--vocab-dir", vocab_dir, "directory of ggml-vocab-*.gguf tokenizer files")->capture_default_str();
  app.add_flag("--force", force, "rewrite files even if they are up to date");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitBadInput;
  }
  if (list) {
    List();
    return kExitOk;
  }
  auto preset = skippy::zoo::ParsePreset(preset_name);
  if (!preset.ok()) {
    std::fprintf(stderr, "skippy-zoo: %s\n", std::string(preset.status().message()).c_str());
    return kExitBadInput;
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "skippy-zoo: --out DIR is required (or --list)\n");
    return kExitBadInput;
  }
  std::vector<const FamilySpec*> selected;
  if (families.empty()) {
    for (const FamilySpec& f : skippy::zoo::Families()) {
      if (*preset != Preset::kReal || f.real) selected.push_back(&f);
    }
  } else {
    for (const std::string& key : families) {
      auto f = skippy::zoo::FindFamily(key);
      if (!f.ok()) {
        std::fprintf(stderr, "skippy-zoo: %s\n", std::string(f.status().message()).c_str());
        return kExitBadInput;
      }
      if (auto d = skippy::zoo::DimsFor(**f, *preset); !d.ok()) {
        std::fprintf(stderr, "skippy-zoo: %s\n", std::string(d.status().message()).c_str());
        return kExitBadInput;
      }
      selected.push_back(*f);
    }
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "skippy-zoo: cannot create %s: %s\n", out_dir.c_str(), ec.message().c_str());
    return kExitFailed;
  }
  const fs::path manifest_path = fs::path(out_dir) / "manifest.json";
  json manifest = LoadManifest(manifest_path);
  manifest["preset"] = std::string(skippy::zoo::PresetName(*preset));
  manifest["synthetic_weights"] = true;
  if (!manifest.contains("families") || !manifest["families"].is_object()) manifest["families"] = json::object();

  int failures = 0;
  for (const FamilySpec* f : selected) {
    const std::string key(f->key);
    const fs::path file = fs::path(out_dir) / (key + ".gguf");
    auto digest = skippy::runtime::SyntheticSpecDigest(*f, *preset, vocab_dir);
    if (!digest.ok()) {
      std::fprintf(stderr, "skippy-zoo: %s: %s\n", key.c_str(), std::string(digest.status().message()).c_str());
      ++failures;
      continue;
    }
    const json& old = manifest["families"].contains(key) ? manifest["families"][key] : json();
    if (!force && old.is_object() && old.value("spec_digest", "") == *digest && fs::exists(file) &&
        fs::file_size(file) == old.value("file_bytes", uint64_t{0})) {
      std::printf("[zoo] %-12s up to date (%s)\n", key.c_str(), file.c_str());
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto info = skippy::runtime::WriteSyntheticModel(*f, *preset, vocab_dir, file.string());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!info.ok()) {
      std::fprintf(stderr, "skippy-zoo: %s: %s\n", key.c_str(), std::string(info.status().message()).c_str());
      ++failures;
      continue;
    }
    std::printf("[zoo] %-12s wrote %s: %.1f M params, %.1f MiB, %u tensors, %.1f s\n", key.c_str(), file.c_str(),
                info->n_params / 1e6, info->file_bytes / 1048576.0, info->n_tensors, secs);
    std::fflush(stdout);
    manifest["families"][key] = {
        {"file", file.filename().string()},
        {"family", std::string(f->display_name())},
        {"arch", std::string(f->arch())},
        {"memory", std::string(skippy::cache::MemoryKindName(f->row().memory))},
        {"payload", std::string(skippy::cache::PayloadKindName(f->row().payload))},
        {"package_only", f->row().package_only},
        {"model_ref", std::string(f->model_ref)},
        {"tokenizer", "ggml-vocab-" + std::string(f->vocab) + ".gguf"},
        {"tokenizer_note", std::string(f->vocab_note)},
        {"n_params", info->n_params},
        {"n_vocab", info->n_vocab},
        {"file_bytes", info->file_bytes},
        {"spec_digest", info->spec_digest},
        {"generate_seconds", secs},
        {"synthetic_weights", true},
    };
    // Written after every family so an interrupted run keeps what it finished.
    std::ofstream(manifest_path) << manifest.dump(2) << "\n";
  }
  std::ofstream(manifest_path) << manifest.dump(2) << "\n";
  return failures == 0 ? kExitOk : kExitFailed;
}
