// skippy-cache-bench: cache core microbenchmarks.
//   Lookup/N       longest-prefix lookup of a 4,096-token prompt against N stored entries (hit)
//   LookupMiss/N   the same prompt with a first token no entry has (miss, reason computed)
//   InsertErase/N  insert a 4,096-token entry into an index of N entries, then erase it
//   ReserveCommit  ResidentPool two-phase record with an LRU eviction every call
//   PayloadPut     PayloadStore::Put of fresh (non-duplicate) bytes, then release; GB/s
//   PayloadPutDup  PayloadStore::Put of bytes already stored (hash + compare path); GB/s
//   Memcpy         plain memcpy of the same bytes into a pre-faulted buffer; GB/s
//   DiskTierRead/N DiskTier::Read of one N MiB entry (open, header check, read, XXH3-128 check)
//                  into a buffer kept between reads; GB/s
//   CatRead/N      the same entry file read to its end in 128 KiB reads, as cat does; GB/s
//                  (cold:0 from the page cache, cold:1 from the device: the file's pages are
//                  dropped before each read; the directory: $SKIPPY_BENCH_DIR, else the temp dir)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "skippy/cache/disk_tier.h"
#include "skippy/cache/payload_store.h"
#include "skippy/cache/radix_index.h"
#include "skippy/cache/resident_pool.h"

namespace skippy::cache {
namespace {

constexpr int32_t kVocab = 151936;
constexpr size_t kPrompt = 4096;
constexpr size_t kSystem = 1024;  // shared system prompt per group
constexpr size_t kTail = 256;     // unique part of each stored entry
constexpr size_t kGroups = 16;

PrefixScope Scope() {
  PrefixScope s;
  s.config.model_id = "bench-model";
  s.config.layer_end = 32;
  s.config.n_ctx = 32768;
  s.config.n_vocab = kVocab;
  return s;
}

std::vector<Token> RandomTokens(std::mt19937& rng, size_t n) {
  std::vector<Token> t(n);
  for (auto& x : t) x = static_cast<Token>(rng() % kVocab);
  return t;
}

// An index of n entries: kGroups system prompts, each entry = system prompt + unique tail.
struct Corpus {
  PrefixScope scope = Scope();
  std::unique_ptr<RadixIndex> index = std::make_unique<RadixIndex>();
  std::vector<std::vector<Token>> systems;
  std::vector<std::vector<Token>> entries;
  std::vector<Token> hit_prompt;   // 4,096 tokens sharing 1,280 with one entry
  std::vector<Token> miss_prompt;  // 4,096 tokens sharing nothing
};

Corpus& GetCorpus(size_t n) {
  static std::map<size_t, std::unique_ptr<Corpus>> cache;
  auto& slot = cache[n];
  if (slot) return *slot;
  slot = std::make_unique<Corpus>();
  Corpus& c = *slot;
  std::mt19937 rng(42);
  for (size_t g = 0; g < kGroups; ++g) c.systems.push_back(RandomTokens(rng, kSystem));
  for (size_t i = 0; i < n; ++i) {
    std::vector<Token> t = c.systems[i % kGroups];
    std::vector<Token> tail = RandomTokens(rng, kTail);
    t.insert(t.end(), tail.begin(), tail.end());
    auto id = c.index->Insert(c.scope, t, {PayloadKind::kResidentKv, t.size() * 32768, 1, 0, 1.0});
    if (!id.ok()) std::abort();
    if (i == n / 2) c.entries.push_back(t);
  }
  c.hit_prompt = c.entries.back();
  std::vector<Token> rest = RandomTokens(rng, kPrompt - c.hit_prompt.size());
  c.hit_prompt.insert(c.hit_prompt.end(), rest.begin(), rest.end());
  c.miss_prompt = RandomTokens(rng, kPrompt);
  return c;
}

void BM_Lookup(benchmark::State& state) {
  Corpus& c = GetCorpus(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    LookupResult r = c.index->Lookup(c.scope, c.hit_prompt, /*pin=*/false);
    benchmark::DoNotOptimize(r);
    if (!r.hit() || r.match->usable_tokens != kSystem + kTail) state.SkipWithError("expected a hit");
  }
  state.counters["entries"] = static_cast<double>(c.index->Stats().entries);
  state.counters["nodes"] = static_cast<double>(c.index->Stats().nodes);
}
BENCHMARK(BM_Lookup)->Arg(1000)->Arg(10000)->Arg(100000)->Unit(benchmark::kMicrosecond);

void BM_LookupMiss(benchmark::State& state) {
  Corpus& c = GetCorpus(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    LookupResult r = c.index->Lookup(c.scope, c.miss_prompt, /*pin=*/false);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_LookupMiss)->Arg(1000)->Arg(10000)->Arg(100000)->Unit(benchmark::kMicrosecond);

void BM_InsertErase(benchmark::State& state) {
  Corpus& c = GetCorpus(static_cast<size_t>(state.range(0)));
  std::mt19937 rng(7);
  std::vector<Token> t = c.systems[3];
  std::vector<Token> tail = RandomTokens(rng, kPrompt - kSystem);
  t.insert(t.end(), tail.begin(), tail.end());
  for (auto _ : state) {
    t.back() = static_cast<Token>(rng() % kVocab);
    auto id = c.index->Insert(c.scope, t, {PayloadKind::kResidentKv, 1, 1, 0, 1.0});
    if (!id.ok()) {
      state.SkipWithError("insert failed");
      break;
    }
    auto erased = c.index->Erase(*id, false);
    benchmark::DoNotOptimize(erased);
  }
}
BENCHMARK(BM_InsertErase)->Arg(1000)->Arg(10000)->Arg(100000)->Unit(benchmark::kMicrosecond);

void BM_ReserveCommit(benchmark::State& state) {
  ResidentPoolOptions o;
  o.max_entries = 1024;
  o.lane_count = 8;
  o.seq_id_begin = 8;
  o.seq_id_end = 8 + 1024;
  o.max_bytes = uint64_t{1} << 40;
  o.max_tokens = size_t{1} << 30;
  auto pool = std::move(*ResidentPool::Create(o));
  PrefixScope s = Scope();
  std::mt19937 rng(9);
  std::vector<Token> t = RandomTokens(rng, kPrompt);
  for (auto _ : state) {
    t[kSystem + rng() % (kPrompt - kSystem)] = static_cast<Token>(rng() % kVocab);
    auto r = pool->Reserve(s, t, {PayloadKind::kResidentKv, kPrompt * 32768, 10.0, true});
    if (!r.ok()) continue;  // a rare duplicate
    auto id = pool->Commit(r->id);
    benchmark::DoNotOptimize(id);
  }
  state.counters["evictions"] = static_cast<double>(pool->Stats().index.evictions);
}
BENCHMARK(BM_ReserveCommit)->Unit(benchmark::kMicrosecond);

std::vector<std::byte> RandomBytes(size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  return v;
}

void BM_PayloadPut(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) << 20;
  auto store = std::move(*PayloadStore::Create({size_t{1} << 20, uint64_t{8} << 30, 256}));
  std::vector<std::byte> data = RandomBytes(n);
  uint64_t counter = 0;
  for (auto _ : state) {
    ++counter;
    for (size_t off = 0; off < n; off += size_t{1} << 20) std::memcpy(data.data() + off, &counter, 8);
    auto put = store->Put(data);  // every block is new
    if (!put.ok()) {
      state.SkipWithError("put failed");
      break;
    }
    PayloadId id = put->id;
    benchmark::DoNotOptimize(store->Release(std::span<const PayloadId>(&id, 1)));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_PayloadPut)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_PayloadPutDup(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) << 20;
  auto store = std::move(*PayloadStore::Create({size_t{1} << 20, uint64_t{8} << 30, 256}));
  std::vector<std::byte> data = RandomBytes(n);
  auto first = store->Put(data);
  for (auto _ : state) {
    auto put = store->Put(data);  // every block already stored
    PayloadId id = put->id;
    benchmark::DoNotOptimize(store->Release(std::span<const PayloadId>(&id, 1)));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
  state.counters["saved_MiB"] = static_cast<double>(store->Stats().saved_bytes >> 20);
  (void)first;
}
BENCHMARK(BM_PayloadPutDup)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) << 20;
  std::vector<std::byte> data = RandomBytes(n);
  std::vector<std::byte> dst(n);  // pre-faulted
  for (auto _ : state) {
    std::memcpy(dst.data(), data.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_Memcpy)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

// One entry of n MiB in a fresh disk tier directory, kept for the process's benchmarks of that size.
struct DiskEntry {
  ~DiskEntry() {
    tier.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path dir;
  std::unique_ptr<DiskTier> tier;
  TierHit hit;
  std::string file;
};

DiskEntry* DiskEntryOf(size_t mib) {
  static std::map<size_t, DiskEntry> entries;
  if (auto it = entries.find(mib); it != entries.end()) return &it->second;
  const char* base = std::getenv("SKIPPY_BENCH_DIR");
  const std::filesystem::path dir = std::filesystem::path(base ? base : std::filesystem::temp_directory_path().string()) /
                                    ("skippy-disk-bench-" + std::to_string(::getpid()) + "-" + std::to_string(mib));
  std::filesystem::remove_all(dir);
  DiskTierOptions o;
  o.dir = dir.string();
  o.max_bytes = uint64_t{4} << 30;
  o.min_free_bytes = 0;
  o.max_queued_bytes = uint64_t{4} << 30;
  auto tier = DiskTier::Open(o, Scope().config);
  if (!tier.ok()) return nullptr;
  std::mt19937 rng(1);
  PrefixRecord r;
  r.tokens = RandomTokens(rng, 2048);
  r.classes = BatchClasses::Of(r.tokens.size(), {}, 2);
  std::vector<std::byte> raw = RandomBytes(mib << 20);
  std::vector<uint8_t> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  const std::vector<Token> tokens = r.tokens;
  (*tier)->Put(std::move(r), std::move(bytes));
  (*tier)->Flush();
  auto hit = (*tier)->Lookup("", tokens);
  if (!hit) return nullptr;
  DiskEntry& e = entries[mib];
  e.dir = dir;
  e.tier = std::move(*tier);
  e.hit = *hit;
  for (const auto& f : std::filesystem::directory_iterator(dir / "entries")) e.file = f.path().string();
  return &e;
}

// Cold: the file's pages are dropped from the page cache before each read (posix_fadvise), so
// the read comes from the device.
void DropFromPageCache(benchmark::State& state, const std::string& file) {
  state.PauseTiming();
  const int fd = ::open(file.c_str(), O_RDONLY);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  state.ResumeTiming();
}

void BM_DiskTierRead(benchmark::State& state) {
  DiskEntry* e = DiskEntryOf(static_cast<size_t>(state.range(0)));
  if (e == nullptr) return state.SkipWithError("no disk tier");
  const bool cold = state.range(1) != 0;
  std::vector<uint8_t> out;  // kept between reads, as the lane cache keeps its buffer
  for (auto _ : state) {
    if (cold) DropFromPageCache(state, e->file);
    if (!e->tier->Read(e->hit, out).ok()) return state.SkipWithError("read failed");
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(e->hit.stored_bytes));
}
BENCHMARK(BM_DiskTierRead)->ArgsProduct({{16, 64}, {0, 1}})->ArgNames({"MiB", "cold"})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CatRead(benchmark::State& state) {
  DiskEntry* e = DiskEntryOf(static_cast<size_t>(state.range(0)));
  if (e == nullptr) return state.SkipWithError("no disk tier");
  const bool cold = state.range(1) != 0;
  std::vector<char> buf(128 << 10);
  for (auto _ : state) {
    if (cold) DropFromPageCache(state, e->file);
    const int fd = ::open(e->file.c_str(), O_RDONLY);
    while (::read(fd, buf.data(), buf.size()) > 0) benchmark::ClobberMemory();
    ::close(fd);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(e->hit.stored_bytes));
}
BENCHMARK(BM_CatRead)->ArgsProduct({{16, 64}, {0, 1}})->ArgNames({"MiB", "cold"})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace skippy::cache

BENCHMARK_MAIN();
