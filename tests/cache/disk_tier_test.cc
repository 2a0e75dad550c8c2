// DiskTier: entries survive a reopen, every read is verified, and nothing that fails a check is
// served: corrupt, truncated, missing, foreign-identity and torn files; the cap; the lock.
#include "skippy/cache/disk_tier.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "test_util.h"

namespace skippy::cache {
namespace {

namespace fs = std::filesystem;
using testing::MakeScope;
using testing::Range;

// The prefix length a lookup serves (0 on a miss), so a miss fails an expectation instead of
// dereferencing an empty optional.
size_t Usable(PrefixTier& t, const std::vector<Token>& tokens) {
  const auto hit = t.Lookup("", tokens);
  return hit ? hit->usable_tokens : 0;
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("skippy-disk-tier-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  DiskTierOptions Options(uint64_t max_bytes = uint64_t{1} << 30) const {
    DiskTierOptions o;
    o.dir = dir_.string();
    o.max_bytes = max_bytes;
    o.min_free_bytes = 0;
    return o;
  }
  std::unique_ptr<DiskTier> Open(const CacheConfigIdentity& id = MakeScope().config, uint64_t max_bytes = uint64_t{1} << 30) {
    auto t = DiskTier::Open(Options(max_bytes), id);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  static PrefixRecord Record(std::vector<Token> tokens, PayloadKind kind = PayloadKind::kResidentKv, std::string ns = "") {
    PrefixRecord r;
    r.tenant_namespace = std::move(ns);
    r.kind = kind;
    r.classes = BatchClasses::Of(tokens.size(), {}, 32);
    r.tokens = std::move(tokens);
    return r;
  }
  static std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
    std::vector<uint8_t> b(n);
    std::mt19937 rng(seed);
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
    return b;
  }
  std::vector<fs::path> Files() const {
    std::vector<fs::path> out;
    for (const auto& f : fs::directory_iterator(dir_ / "entries")) out.push_back(f.path());
    std::sort(out.begin(), out.end());
    return out;
  }
  static void FlipByte(const fs::path& p, uint64_t at) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
  }

  fs::path dir_;
};

TEST_F(DiskTierTest, EntriesSurviveAReopenAndReadBackExactly) {
  const auto bytes = Bytes(100000, 1);
  {
    auto t = Open();
    ASSERT_TRUE(t->Put(Record(Range(0, 100)), bytes));
    t->Flush();
    EXPECT_EQ(t->Stats().writes, 1u);
    EXPECT_FALSE(t->Put(Record(Range(0, 100)), bytes)) << "already stored";
  }
  auto t = Open();
  EXPECT_EQ(t->Stats().loaded_at_open, 1u);
  auto hit = t->Lookup("", Range(0, 100));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->usable_tokens, 100u);
  EXPECT_EQ(hit->record.tokens, Range(0, 100));
  EXPECT_EQ(hit->record.classes.size(), 100u);
  auto read = t->Read(*hit);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
  EXPECT_EQ(t->Stats().hits, 1u);
}

TEST_F(DiskTierTest, ServingRulesAreTheRadixIndexs) {
  auto t = Open();
  ASSERT_TRUE(t->Put(Record(Range(0, 100)), Bytes(1000, 1)));
  auto swa = Record(Range(500, 600));
  swa.exact_only = true;
  ASSERT_TRUE(t->Put(swa, Bytes(1000, 2)));
  ASSERT_TRUE(t->Put(Record(Range(600, 700), PayloadKind::kKvRecurrent), Bytes(1000, 3)));
  t->Flush();
  // ResidentKv serves the shared prefix of a prompt that goes on differently.
  std::vector<Token> branch = Range(0, 60);
  branch.push_back(999);
  auto hit = t->Lookup("", branch);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->usable_tokens, 60u);
  // exact_only and KvRecurrent: their own length only.
  EXPECT_FALSE(t->Lookup("", Range(500, 560)).has_value());
  EXPECT_EQ(Usable(*t, Range(500, 650)), 100u);
  EXPECT_FALSE(t->Lookup("", Range(600, 650)).has_value());
  EXPECT_EQ(Usable(*t, Range(600, 800)), 100u);
  // Another namespace sees nothing.
  EXPECT_FALSE(t->Lookup("tenant-b", Range(0, 100)).has_value());
}

TEST_F(DiskTierTest, AnotherIdentitysEntriesAreKeptButNeverServed) {
  {
    auto t = Open();
    ASSERT_TRUE(t->Put(Record(Range(0, 100)), Bytes(1000, 1)));
  }
  CacheConfigIdentity other = MakeScope().config;
  other.type_k = "q8_0";
  {
    auto t = Open(other);
    EXPECT_FALSE(t->Lookup("", Range(0, 100)).has_value());
    const DiskTierStats s = t->Stats();
    EXPECT_EQ(s.loaded_at_open, 0u);
    EXPECT_EQ(s.foreign_entries, 1u);
    EXPECT_GT(s.foreign_bytes, 1000u);
  }
  auto t = Open();
  EXPECT_TRUE(t->Lookup("", Range(0, 100)).has_value());
}

TEST_F(DiskTierTest, CorruptPayloadIsAMissThatRemovesTheEntry) {
  {
    auto t = Open();
    ASSERT_TRUE(t->Put(Record(Range(0, 100)), Bytes(5000, 1)));
  }
  const fs::path file = Files().at(0);
  FlipByte(file, fs::file_size(file) - 10);  // in the payload: the header still verifies
  auto t = Open();
  auto hit = t->Lookup("", Range(0, 100));
  ASSERT_TRUE(hit.has_value());
  auto read = t->Read(*hit);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_EQ(t->Stats().corrupt, 1u);
  EXPECT_EQ(t->Stats().entries, 0u);
  EXPECT_FALSE(fs::exists(file));
  EXPECT_FALSE(t->Lookup("", Range(0, 100)).has_value());
}

TEST_F(DiskTierTest, CorruptHeaderTruncatedFileAndTornWriteAreRemovedAtOpen) {
  {
    auto t = Open();
    for (Token i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(Record(Range(i * 100, i * 100 + 100)), Bytes(5000, i)));
  }
  const auto files = Files();
  ASSERT_EQ(files.size(), 3u);
  FlipByte(files[0], 40);                                    // header byte
  fs::resize_file(files[1], fs::file_size(files[1]) - 1);    // one byte short
  std::ofstream(dir_ / "tmp" / "torn.tmp") << "half an entry";  // a crash before the rename
  std::ofstream(dir_ / "entries" / "junk.skc") << "not an entry";
  auto t = Open();
  const DiskTierStats s = t->Stats();
  EXPECT_EQ(s.loaded_at_open, 1u);
  EXPECT_EQ(s.corrupt, 4u);
  EXPECT_EQ(Files().size(), 1u);
  EXPECT_TRUE(fs::is_empty(dir_ / "tmp"));
}

TEST_F(DiskTierTest, FileChangedOrDeletedAfterOpenIsCountedNotServed) {
  auto t = Open();
  ASSERT_TRUE(t->Put(Record(Range(0, 100)), Bytes(5000, 1)));
  ASSERT_TRUE(t->Put(Record(Range(200, 300)), Bytes(5000, 2)));
  t->Flush();
  auto a = t->Lookup("", Range(0, 100));
  auto b = t->Lookup("", Range(200, 300));
  ASSERT_TRUE(a && b);
  for (const fs::path& f : Files()) {
    if (fs::file_size(f) > 0) fs::resize_file(f, fs::file_size(f) / 2);
  }
  EXPECT_EQ(t->Read(*a).status().code(), absl::StatusCode::kDataLoss);
  for (const fs::path& f : Files()) fs::remove(f);
  EXPECT_EQ(t->Read(*b).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(t->Stats().corrupt, 2u);
  EXPECT_EQ(t->Stats().entries, 0u);
}

TEST_F(DiskTierTest, AFileOfTheSamePrefixWithOtherBatchClassesIsNotServed) {
  // A file's name covers identity, namespace, kind and tokens, not the rows' batch classes: the
  // same prefix recorded with other classes (evicted and written again between a lookup and its
  // read) lands under the same name, and its rows are not what the lookup promised.
  auto t = Open();
  ASSERT_TRUE(t->Put(Record(Range(0, 100)), Bytes(5000, 1)));
  t->Flush();
  const auto hit = t->Lookup("", Range(0, 100));
  ASSERT_TRUE(hit);

  const fs::path other_dir = dir_.string() + "-other";
  fs::remove_all(other_dir);
  {
    DiskTierOptions o = Options();
    o.dir = other_dir.string();
    auto other = DiskTier::Open(o, MakeScope().config);
    ASSERT_TRUE(other.ok()) << other.status();
    PrefixRecord r = Record(Range(0, 100));
    const size_t message_ends[] = {90};
    r.classes = BatchClasses::Of(100, message_ends, 32);  // rows 90..99: a short message of their own
    ASSERT_FALSE(r.classes == Record(Range(0, 100)).classes);
    ASSERT_TRUE((*other)->Put(std::move(r), Bytes(5000, 1)));
    (*other)->Flush();
  }
  const std::vector<fs::path> mine = Files();
  ASSERT_EQ(mine.size(), 1u);
  fs::copy_file(other_dir / "entries" / mine[0].filename(), mine[0], fs::copy_options::overwrite_existing);
  fs::remove_all(other_dir);

  EXPECT_EQ(t->Read(*hit).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(t->Stats().corrupt, 1u);
}

TEST_F(DiskTierTest, TheCapEvictsLeastRecentlyUsedFirst) {
  auto t = Open(MakeScope().config, /*max_bytes=*/3 * 11000);
  for (Token i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(Record(Range(i * 1000, i * 1000 + 100)), Bytes(10000, i)));
  t->Flush();
  ASSERT_EQ(t->Stats().entries, 3u);
  ASSERT_TRUE(t->Lookup("", Range(0, 100)).has_value());  // entry 0 is now the most recent
  ASSERT_TRUE(t->Put(Record(Range(5000, 5100)), Bytes(10000, 9)));
  t->Flush();
  const DiskTierStats s = t->Stats();
  EXPECT_EQ(s.entries, 3u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_LE(s.bytes, s.capacity_bytes);
  EXPECT_TRUE(t->Lookup("", Range(0, 100)).has_value());
  EXPECT_FALSE(t->Lookup("", Range(1000, 1100)).has_value());
  EXPECT_EQ(t->Stats().misses_evicted, 1u);
  EXPECT_EQ(Files().size(), 3u);
  // Larger than the whole cap: dropped.
  EXPECT_FALSE(t->Put(Record(Range(7000, 7100)), Bytes(40000, 1)));
  EXPECT_EQ(t->Stats().write_drops, 1u);
}

TEST_F(DiskTierTest, ClearRemovesOneNamespaceOrAll) {
  auto t = Open();
  ASSERT_TRUE(t->Put(Record(Range(0, 100), PayloadKind::kResidentKv, "a"), Bytes(1000, 1)));
  ASSERT_TRUE(t->Put(Record(Range(0, 100), PayloadKind::kResidentKv, "b"), Bytes(1000, 1)));
  t->Flush();
  EXPECT_EQ(t->Clear("a"), 1u);
  EXPECT_FALSE(t->Lookup("a", Range(0, 100)).has_value());
  EXPECT_TRUE(t->Lookup("b", Range(0, 100)).has_value());
  EXPECT_EQ(Files().size(), 1u);
  EXPECT_EQ(t->Clear(std::nullopt), 1u);
  EXPECT_TRUE(Files().empty());
}

TEST_F(DiskTierTest, ASecondOwnerIsRefusedWithAClearError) {
  auto first = Open();
  auto second = DiskTier::Open(Options(), MakeScope().config);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another process (pid " + std::to_string(::getpid())),
            std::string::npos)
      << second.status();
  // Another process too; and the directory is free again once the first owner is gone.
  const pid_t child = ::fork();
  if (child == 0) _exit(DiskTier::Open(Options(), MakeScope().config).ok() ? 0 : 3);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 3);
  first.reset();
  EXPECT_TRUE(DiskTier::Open(Options(), MakeScope().config).ok());
}

TEST_F(DiskTierTest, ALockTakenBeforeOpenIsTheTiersAndReleasedWithIt) {
  auto lock = CacheDirLock::Acquire(dir_.string());
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_TRUE(fs::is_directory(dir_));
  // Held, the directory is refused to anyone else, in this process too.
  auto refused = DiskTier::Open(Options(), MakeScope().config);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  // Another directory's lock is not this one's.
  auto other = CacheDirLock::Acquire((dir_ / "other").string());
  ASSERT_TRUE(other.ok()) << other.status();
  auto wrong = DiskTier::Open(Options(), MakeScope().config, *other);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  auto t = DiskTier::Open(Options(), MakeScope().config, *lock);
  ASSERT_TRUE(t.ok()) << t.status();
  lock->reset();  // the tier holds it now
  EXPECT_FALSE(CacheDirLock::Acquire(dir_.string()).ok());
  t->reset();
  EXPECT_TRUE(CacheDirLock::Acquire(dir_.string()).ok());
}

TEST_F(DiskTierTest, AnUnusableDirectoryIsAClearErrorAtOpen) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  DiskTierOptions o = Options();
  o.dir = (dir_ / "file" / "cache").string();
  auto t = DiskTier::Open(o, MakeScope().config);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("cannot create"), std::string::npos) << t.status();
  o.dir = "";
  EXPECT_EQ(DiskTier::Open(o, MakeScope().config).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DiskTierTest, AWriteThatWouldFillTheFilesystemIsSkipped) {
  DiskTierOptions o = Options();
  o.min_free_bytes = uint64_t{1} << 62;  // more than any filesystem has free
  auto t = DiskTier::Open(o, MakeScope().config);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Put(Record(Range(0, 100)), Bytes(1000, 1)));
  (*t)->Flush();
  EXPECT_EQ((*t)->Stats().no_space, 1u);
  EXPECT_EQ((*t)->Stats().entries, 0u);
  EXPECT_TRUE(Files().empty());
}

}  // namespace
}  // namespace skippy::cache
