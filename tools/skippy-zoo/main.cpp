// skippy-zoo: writes the synthetic model zoo (one GGUF per family) or lists it.
//
//   skippy-zoo --list
//   skippy-zoo --preset tiny --out DIR [--family KEY ...] [--format FMT ...] [--force]
//
// DIR/<family>.gguf is the synthetic model in F16. Each --format (a llama-quantize type name such
// as Q4_K_M, Q8_0, IQ2_XS, or `ref` for the format of the family's model ref) also writes
// DIR/<family>.<FMT>.gguf, made from it with the pinned build's llama-quantize; formats that need
// an importance matrix (IQ1_*, IQ2_*) get one from llama-imatrix run on the model over a fixed
// text, as a user would make one.
//
// DIR/manifest.json records, per family, the file, its size, parameter count and the spec digest
// that produced it, and per format the quantized file and what it was made from. A file that exists
// with a matching digest and size is not rewritten, so repeated calls (tests, the benchmark
// wrapper) are cheap and a stale or truncated file is regenerated.
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "skippy/common/subprocess.h"
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
  std::printf("%-12s %-14s %-10s %-8s %-14s %8s %8s %8s %8s %-7s  %s\n", "family", "name", "arch", "memory", "payload",
              "tiny", "small", "bench", "real", "ref", "tokenizer");
  for (const FamilySpec& f : skippy::zoo::Families()) {
    auto fmt = [&](Preset p) -> std::string {
      auto d = skippy::zoo::DimsFor(f, p);
      if (!d.ok()) return "-";
      const double n = static_cast<double>(skippy::zoo::ApproxParameterCount(f, *d, VocabSizeGuess(f.vocab)));
      return n >= 1e9 ? absl::StrFormat("%.2fB", n / 1e9) : absl::StrFormat("%.1fM", n / 1e6);
    };
    std::printf("%-12s %-14s %-10s %-8s %-14s %8s %8s %8s %8s %-7s  %s%s\n", std::string(f.key).c_str(),
                std::string(f.display_name()).c_str(), std::string(f.arch()).c_str(),
                std::string(skippy::cache::MemoryKindName(f.row().memory)).c_str(),
                std::string(skippy::cache::PayloadKindName(f.row().payload)).c_str(),
                fmt(Preset::kTiny).c_str(), fmt(Preset::kSmall).c_str(), fmt(Preset::kBench).c_str(),
                fmt(Preset::kReal).c_str(), std::string(f.ref_format).c_str(),
                std::string(f.vocab).c_str(), f.vocab_note.empty() ? "" : " (stand-in)");
  }
  std::printf("\nParameter counts are approximate (from the dims; the manifest has exact counts).\n"
              "Presets: tiny (tests), small (quantized-format tests), bench (benchmarks), real (real hyperparameters,\n"
              "where they fit). ref: the weight format of the family's model ref (--format ref).\n"
              "All weights are synthetic: deterministic random values, not a trained model.\n");
}

// llama-quantize refuses these without an importance matrix.
bool NeedsImatrix(std::string_view f) { return f.starts_with("IQ1") || f.starts_with("IQ2"); }


// A fixed English text for llama-imatrix: the statistics only need activations, and the same text
// every time keeps the quantized files reproducible.
std::string ImatrixText() {
  static constexpr std::string_view kPassage =
      "The cache keeps the state of a prompt's prefix so that the next request that starts the same "
      "way does not compute it again. A request arrives with a system prompt, a few documents and a "
      "question; the server looks up the longest prefix it has seen, restores it, and computes only "
      "what follows. Tools return results, agents take another step, and the conversation grows by "
      "a message at a time. Numbers such as 17, 256 and 4096 appear in code, tables and logs. ";
  std::string out;
  for (int i = 0; i < 24; ++i) out += kPassage;
  return out;
}

// Runs argv to completion with its output in log_path; an error quotes the log's tail.
skippy::Status RunTool(const std::vector<std::string>& argv, const std::string& log_path) {
  auto proc = skippy::Subprocess::Start(argv, log_path);
  if (!proc.ok()) return proc.status();
  std::optional<int> rc;
  while (!(rc = proc->Poll())) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (*rc != 0) {
    return absl::InternalError(absl::StrFormat("%s exited with %d: %s", argv[0], *rc, skippy::TailOfFile(log_path, 600)));
  }
  return absl::OkStatus();
}

struct QuantizeTools {
  std::string quantize;  // llama-quantize
  std::string imatrix;   // llama-imatrix
  int threads = 2;
};

// Writes `out` from the F16 file `base` in `format`; returns whether an importance matrix was used.
skippy::StatusOr<bool> Quantize(const QuantizeTools& tools, const fs::path& base, const std::string& format,
                                const fs::path& out) {
  const std::string log = out.string() + ".log";
  std::vector<std::string> argv = {tools.quantize};
  const bool imatrix = NeedsImatrix(format);
  if (imatrix) {
    const fs::path text = base.string() + ".imatrix.txt";
    const fs::path dat = base.string() + ".imatrix.gguf";
    std::ofstream(text) << ImatrixText();
    SKIPPY_RETURN_IF_ERROR(RunTool({tools.imatrix, "-m", base.string(), "-f", text.string(), "-o", dat.string(),
                                    "-c", "128", "--chunks", "8", "-t", std::to_string(tools.threads)},
                                   base.string() + ".imatrix.log"));
    argv.insert(argv.end(), {"--imatrix", dat.string()});
  }
  const fs::path tmp = out.string() + ".partial";
  argv.insert(argv.end(), {base.string(), tmp.string(), format, std::to_string(tools.threads)});
  SKIPPY_RETURN_IF_ERROR(RunTool(argv, log));
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) return absl::InternalError(absl::StrFormat("cannot rename %s: %s", tmp.string(), ec.message()));
  return imatrix;
}

json LoadManifest(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return json::object();
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return json::object();
  return j;
}

// Writes each requested format of one family next to its F16 file and records it in `entry`
// ("formats": {FMT: {...}}). Returns the number of formats that failed.
int WriteFormats(const FamilySpec& f, const fs::path& base, const std::string& spec_digest,
                 const std::vector<std::string>& formats, const QuantizeTools& tools, bool force, json& entry) {
  int failures = 0;
  const std::string key(f.key);
  entry["ref_format"] = std::string(f.ref_format);
  if (!entry.contains("formats") || !entry["formats"].is_object()) entry["formats"] = json::object();
  for (const std::string& requested : formats) {
    const std::string format = requested == "ref" ? std::string(f.ref_format) : requested;
    if (format == "F16") continue;  // the base file
    const fs::path out = base.parent_path() / skippy::zoo::ZooFileName(f, format);
    const json& old = entry["formats"].contains(format) ? entry["formats"][format] : json();
    if (!force && old.is_object() && old.value("source_spec_digest", "") == spec_digest &&
        old.value("llama_cpp_commit", "") == SKIPPY_LLAMA_COMMIT && fs::exists(out) &&
        fs::file_size(out) == old.value("file_bytes", uint64_t{0})) {
      std::printf("[zoo] %-12s %-7s up to date (%s)\n", key.c_str(), format.c_str(), out.c_str());
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto imatrix = Quantize(tools, base, format, out);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!imatrix.ok()) {
      std::fprintf(stderr, "skippy-zoo: %s %s: %s\n", key.c_str(), format.c_str(),
                   std::string(imatrix.status().message()).c_str());
      ++failures;
      continue;
    }
    const uint64_t bytes = fs::file_size(out);
    std::printf("[zoo] %-12s %-7s wrote %s: %.1f MiB, %.1f s%s\n", key.c_str(), format.c_str(), out.c_str(),
                bytes / 1048576.0, secs, *imatrix ? " (with an importance matrix)" : "");
    std::fflush(stdout);
    entry["formats"][format] = {
        {"file", out.filename().string()},
        {"file_bytes", bytes},
        {"source_spec_digest", spec_digest},
        {"llama_cpp_commit", SKIPPY_LLAMA_COMMIT},
        {"imatrix", *imatrix},
        {"quantize_seconds", secs},
        {"synthetic_weights", true},
    };
  }
  return failures;
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
  std::vector<std::string> formats;
  QuantizeTools tools{SKIPPY_DEFAULT_LLAMA_BIN_DIR "/llama-quantize", SKIPPY_DEFAULT_LLAMA_BIN_DIR "/llama-imatrix", 2};
  app.add_flag("--list", list, "list families, architectures, presets and parameter counts");
  app.add_option("--format", formats,
                 "also write <family>.<FMT>.gguf quantized from the F16 model (llama-quantize type, e.g. Q4_K_M, "
                 "Q8_0, IQ2_XS; `ref` = the format of the family's model ref); repeatable");
  app.add_option("--llama-quantize", tools.quantize, "llama-quantize binary")->capture_default_str();
  app.add_option("--llama-imatrix", tools.imatrix, "llama-imatrix binary")->capture_default_str();
  app.add_option("--threads", tools.threads, "threads for quantization")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--preset", preset_name, "tiny | small | bench | real")->capture_default_str();
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
  for (std::string& f : formats) {
    auto parsed = skippy::zoo::ParseZooFormat(f);
    if (!parsed.ok()) {
      std::fprintf(stderr, "skippy-zoo: --format: %s\n", std::string(parsed.status().message()).c_str());
      return kExitBadInput;
    }
    f = *std::move(parsed);
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "skippy-zoo: --out DIR is required (or --list)\n");
    return kExitBadInput;
  }
  std::vector<const FamilySpec*> selected;
  if (families.empty()) {
    for (const FamilySpec& f : skippy::zoo::Families()) {
      if (skippy::zoo::DimsFor(f, *preset).ok()) selected.push_back(&f);
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
      failures += WriteFormats(*f, file, *digest, formats, tools, force, manifest["families"][key]);
      std::ofstream(manifest_path) << manifest.dump(2) << "\n";
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
    failures += WriteFormats(*f, file, *digest, formats, tools, force, manifest["families"][key]);
    // Written after every family so an interrupted run keeps what it finished.
    std::ofstream(manifest_path) << manifest.dump(2) << "\n";
  }
  std::ofstream(manifest_path) << manifest.dump(2) << "\n";
  return failures == 0 ? kExitOk : kExitFailed;
}
