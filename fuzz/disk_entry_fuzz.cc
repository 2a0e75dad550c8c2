// Fuzz target: a disk tier entry file damaged in every way the input can describe -- bytes
// flipped anywhere, the file cut short, bytes appended -- then opened and read as a restarted
// server would. Nothing may crash, and a read that succeeds must return the bytes that were
// written: a damaged entry is a miss, never a wrong payload.
//
// Input: byte 0 bit 0: append the input's tail; bytes 1-4: cut the file to this length (mod its
// size + 1; 0 keeps it); then (u32 offset, u8 xor) edits.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "skippy/cache/disk_tier.h"

namespace {

namespace fs = std::filesystem;
using skippy::cache::DiskTier;

struct Golden {
  fs::path dir;
  skippy::cache::CacheConfigIdentity identity;
  skippy::cache::DiskTierOptions options;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;
  std::string file;  // the entry as written
  std::string name;  // its file name
};

const Golden& GetGolden() {
  static const Golden g = [] {
    Golden g;
    g.dir = fs::temp_directory_path() / ("skippy-fuzz-disk-" + std::to_string(::getpid()));
    fs::remove_all(g.dir);
    g.identity.model_id = "fuzz-model";
    g.identity.layer_end = 1;
    g.identity.n_ctx = 4096;
    g.identity.n_vocab = 1000;
    g.options.dir = g.dir.string();
    g.options.min_free_bytes = 0;
    g.tokens.resize(300);
    std::iota(g.tokens.begin(), g.tokens.end(), 1);
    g.payload.resize(4096);
    for (size_t i = 0; i < g.payload.size(); ++i) g.payload[i] = static_cast<uint8_t>(i * 131 + 7);
    {
      auto tier = DiskTier::Open(g.options, g.identity);
      if (!tier.ok()) std::abort();
      skippy::cache::PrefixRecord r;
      r.tokens = g.tokens;
      r.classes = skippy::cache::BatchClasses::Of(r.tokens.size(), {}, 64);
      if (!(*tier)->Put(r, g.payload)) std::abort();
      (*tier)->Flush();
    }
    for (const auto& f : fs::directory_iterator(g.dir / "entries")) {
      g.name = f.path().filename().string();
      std::ifstream in(f.path(), std::ios::binary);
      g.file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (g.file.empty()) std::abort();
    return g;
  }();
  return g;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Golden& g = GetGolden();
  std::string file = g.file;
  if (size >= 5) {
    uint32_t cut = 0;
    std::memcpy(&cut, data + 1, 4);
    cut %= static_cast<uint32_t>(file.size() + 1);
    size_t at = 5;
    for (; at + 5 <= size; at += 5) {
      uint32_t off = 0;
      std::memcpy(&off, data + at, 4);
      file[off % file.size()] = static_cast<char>(file[off % file.size()] ^ data[at + 4]);
    }
    if (cut != 0) file.resize(cut);
    if (data[0] & 1) file.append(reinterpret_cast<const char*>(data + at), size - at);
  }
  {
    std::ofstream out(g.dir / "entries" / g.name, std::ios::binary | std::ios::trunc);
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
  }
  auto tier = DiskTier::Open(g.options, g.identity);
  if (!tier.ok()) std::abort();  // a damaged entry never stops a start
  if (auto hit = (*tier)->Lookup("", g.tokens)) {
    auto bytes = (*tier)->Read(*hit);
    if (bytes.ok() && *bytes != g.payload) std::abort();  // a wrong payload served
    if (bytes.ok() && file.size() != g.file.size()) std::abort();  // a cut or extended file served
  }
  return 0;
}
