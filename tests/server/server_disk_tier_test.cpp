// The disk tier on the serving path (--cache-dir): a server restarted on the same directory serves
// the prefixes its last run recorded, from disk, with outputs and log-probabilities identical to
// a --no-cache server's, on a dense (llama), a sliding-window (gemma3) and a hybrid (qwen3next)
// tiny family; corrupt and foreign entries are counted and never served; the byte cap holds; a
// directory that is unusable or already owned stops the server at startup with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "server_process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using skippy::server_test::PostJson;
using skippy::server_test::ServerProcess;

// Four documents, each asked two questions: documents of 130-250 tokens, questions of 8-40.
struct Workload {
  std::vector<std::vector<int>> docs;
  std::vector<std::vector<int>> questions;  // two per document
  std::vector<int> Prompt(size_t doc, size_t question) const {
    std::vector<int> p = docs[doc];
    const auto& q = questions[2 * doc + question];
    p.insert(p.end(), q.begin(), q.end());
    return p;
  }
};

Workload MakeWorkload(uint32_t seed) {
  std::mt19937 rng(seed);
  auto run = [&](int a, int b) {
    std::vector<int> v(std::uniform_int_distribution<int>(a, b)(rng));
    for (int& t : v) t = std::uniform_int_distribution<int>(1000, 9000)(rng);
    return v;
  };
  Workload w;
  for (int d = 0; d < 4; ++d) {
    w.docs.push_back(run(130, 250));
    w.questions.push_back(run(8, 40));
    w.questions.push_back(run(8, 40));
  }
  return w;
}

// No answer prefill: these tests count the entries on disk, and an exchange recorded while the
// server is idle would add entries depending on the client's timing.
const std::vector<std::string> kCommon = {"-c", "512", "--prefill-chunk", "128", "--cache-record-stride", "64",
                                          "--runtime-lane-count", "1", "--answer-prefill-idle-ms", "-1"};

std::vector<std::string> Flags(std::vector<std::string> extra) {
  std::vector<std::string> f = kCommon;
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

json Complete(httplib::Client& c, const std::vector<int>& prompt) {
  json req = {{"prompt", prompt}, {"n_predict", 6}, {"temperature", 0}, {"ignore_eos", true},
              {"return_tokens", true}, {"n_probs", 2}};
  auto [status, body] = PostJson(c, "/completion", req);
  EXPECT_EQ(status, 200) << body.dump();
  return body;
}

json Stats(const ServerProcess& s) { return json::parse(s.Client()->Get("/cache/stats")->body); }

class DiskTierServing : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    name_ = "skippy-disk-serving-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name_.begin(), name_.end(), '/', '_');
    dir_ = fs::temp_directory_path() / name_;
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Records each document's first question on a server that is then stopped.
  void Record(const std::string& family, const Workload& w) {
    auto first = ServerProcess::Start(family, Flags({"--cache-dir", dir_.string()}), name_ + "-rec");
    ASSERT_TRUE(first);
    auto c = first->Client();
    for (size_t d = 0; d < w.docs.size(); ++d) Complete(*c, w.Prompt(d, 0));
    EXPECT_EQ(first->Stop(), 0) << first->LogTail();
    ASSERT_FALSE(fs::is_empty(dir_ / "entries"));
  }

  // Sends both questions of every document to a fresh server on the directory and to a
  // --no-cache server; every answer must be identical. Returns the fresh server's /cache/stats and
  // how many answers restored a prefix from disk.
  std::pair<json, int> Replay(const std::string& family, const Workload& w, std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"--cache-dir", dir_.string()});
    auto on = ServerProcess::Start(family, Flags(extra), name_ + "-on");
    auto off = ServerProcess::Start(family, Flags({"--no-cache"}), name_ + "-off");
    EXPECT_TRUE(on && off);
    if (!on || !off) return {json{}, 0};
    auto con = on->Client();
    auto coff = off->Client();
    int disk_hits = 0;
    for (size_t d = 0; d < w.docs.size(); ++d) {
      for (size_t q = 0; q < 2; ++q) {
        const json a = Complete(*con, w.Prompt(d, q));
        const json b = Complete(*coff, w.Prompt(d, q));
        EXPECT_EQ(a["tokens"], b["tokens"]) << family << " doc " << d << " q " << q << ": " << a["skippy"].dump();
        EXPECT_EQ(a["completion_probabilities"], b["completion_probabilities"])
            << family << " doc " << d << " q " << q << ": logits differ, " << a["skippy"].dump();
        disk_hits += a["skippy"].value("cache_tier", "") == "disk" ? 1 : 0;
      }
    }
    EXPECT_TRUE(on->alive()) << on->LogTail();
    return {Stats(*on), disk_hits};
  }

  fs::path dir_;
  std::string name_;
};

TEST_P(DiskTierServing, RestartServesRecordedPrefixesFromDiskExactly) {
  const Workload w = MakeWorkload(0xd15c + static_cast<uint32_t>(GetParam().size()));
  Record(GetParam(), w);
  auto [stats, disk_hits] = Replay(GetParam(), w);
  ASSERT_FALSE(stats.is_null());
  EXPECT_GT(stats["disk"].value("loaded_at_open", 0), 0) << stats.dump();
  // Each document's first prefix comes back from disk (later questions may hit RAM or the lane).
  EXPECT_GE(disk_hits, 4) << stats.dump();
  EXPECT_EQ(stats["disk"]["hits"], stats["disk_hits"]) << stats.dump();
  EXPECT_EQ(stats["disk"].value("corrupt", -1), 0) << stats.dump();
}

INSTANTIATE_TEST_SUITE_P(Families, DiskTierServing, ::testing::Values("llama", "gemma3", "qwen3next"));

class DiskTierFaults : public DiskTierServing {};

TEST_F(DiskTierFaults, CorruptEntriesAreCountedAndNeverServed) {
  const Workload w = MakeWorkload(7);
  Record("llama", w);
  // One entry loses its tail, the others get a flipped payload byte: Open cannot tell the flip
  // (only the header is read then), the read's checksum does.
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir_ / "entries")) files.push_back(f.path());
  ASSERT_GE(files.size(), 2u);
  fs::resize_file(files[0], fs::file_size(files[0]) - 100);
  for (size_t i = 1; i < files.size(); ++i) {
    std::fstream f(files[i], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(files[i]) - 1000));
    f.put('\x7f');
  }
  auto [stats, disk_hits] = Replay("llama", w);
  ASSERT_FALSE(stats.is_null());
  EXPECT_EQ(disk_hits, 0) << stats.dump();
  EXPECT_EQ(stats["disk"].value("corrupt", 0), static_cast<int>(files.size())) << stats.dump();
}

TEST_F(DiskTierFaults, AnotherConfigurationsEntriesAreIgnored) {
  const Workload w = MakeWorkload(8);
  Record("llama", w);
  // Another context size is another identity: nothing is served, everything is kept.
  std::vector<std::string> other = {"--cache-dir", dir_.string(), "-c", "1024", "--prefill-chunk", "128",
                                    "--runtime-lane-count", "1"};
  auto on = ServerProcess::Start("llama", other, name_ + "-other");
  ASSERT_TRUE(on);
  auto c = on->Client();
  const json a = Complete(*c, w.Prompt(0, 0));
  EXPECT_NE(a["skippy"].value("cache_tier", ""), "disk");
  const json stats = Stats(*on);
  EXPECT_GT(stats["disk"].value("foreign_entries", 0), 0) << stats.dump();
  EXPECT_EQ(stats["disk"].value("loaded_at_open", -1), 0) << stats.dump();
  EXPECT_EQ(stats["disk"].value("hits", -1), 0) << stats.dump();
}

// --one-row-class=auto with a disk tier: the first start measures and keeps its decision in the
// directory; a restart takes it without measuring (so it reads the entries its last run wrote:
// their identity holds the class), with a --no-cache server's answers in that class. A decision
// file that cannot be parsed, or holds another key, is measured over and written anew.
TEST_F(DiskTierFaults, AMeasuredClassIsKeptForTheNextStart) {
  const Workload w = MakeWorkload(9);
  const std::vector<std::string> flags = Flags({"--cache-dir", dir_.string(), "--one-row-class=auto"});
  auto decision_files = [&] {
    std::vector<fs::path> v;
    if (fs::is_directory(dir_ / "one-row-class")) {
      for (const auto& f : fs::directory_iterator(dir_ / "one-row-class")) v.push_back(f.path());
    }
    return v;
  };
  json first_class;
  {
    auto first = ServerProcess::Start("llama", flags, name_ + "-first");
    ASSERT_TRUE(first);
    first_class = Stats(*first)["one_row_class"];
    ASSERT_TRUE(first_class["measured"].contains("ratio")) << first_class.dump();
    EXPECT_FALSE(first_class.contains("kept")) << first_class.dump();
    Complete(*first->Client(), w.Prompt(0, 0));
    EXPECT_EQ(first->Stop(), 0) << first->LogTail();
  }
  ASSERT_EQ(decision_files().size(), 1u);
  const bool on = first_class["on"].get<bool>();
  {
    auto again = ServerProcess::Start("llama", flags, name_ + "-again");
    ASSERT_TRUE(again);
    const json cls = Stats(*again)["one_row_class"];
    EXPECT_TRUE(cls.value("kept", false)) << cls.dump();
    EXPECT_EQ(cls["on"], first_class["on"]) << cls.dump();
    EXPECT_EQ(cls["measured"], first_class["measured"]) << "not measured again";
    auto ref = ServerProcess::Start("llama", Flags({"--no-cache", on ? "--one-row-class=on" : "--one-row-class=off"}),
                                    name_ + "-ref");
    ASSERT_TRUE(ref);
    const json a = Complete(*again->Client(), w.Prompt(0, 1));
    EXPECT_EQ(a["skippy"].value("cache_tier", ""), "disk") << a["skippy"].dump();
    const json b = Complete(*ref->Client(), w.Prompt(0, 1));
    EXPECT_EQ(a["tokens"], b["tokens"]);
    EXPECT_EQ(a["completion_probabilities"], b["completion_probabilities"]);
  }
  const fs::path file = decision_files().at(0);
  const json kept = json::parse(std::ifstream(file));
  for (const std::string& bad : {std::string("{not json"), json{{"key", "another"}, {"on", !on}}.dump()}) {
    SCOPED_TRACE(bad);
    std::ofstream(file, std::ios::trunc) << bad;
    auto next = ServerProcess::Start("llama", flags, name_ + "-bad");
    ASSERT_TRUE(next);
    const json cls = Stats(*next)["one_row_class"];
    EXPECT_FALSE(cls.contains("kept")) << cls.dump();
    EXPECT_TRUE(cls["measured"].contains("ratio")) << cls.dump();
    const json rewritten = json::parse(std::ifstream(file));
    EXPECT_EQ(rewritten["key"], kept["key"]);
    EXPECT_EQ(rewritten["on"], cls["on"]);
    EXPECT_EQ(next->Stop(), 0) << next->LogTail();
  }
}

// In the one-row class a finished job's exchange (its prompt and the tokens decoded after it) is
// recorded once its response is out, not in idle time (none comes here): a server stopped right
// after writes it to disk, and a restart serves the conversation's next turn the exchange from
// disk, with a --no-cache server's bits.
TEST_F(DiskTierFaults, AnExchangeIsOnDiskAfterAStopWithNoIdleTime) {
  const std::vector<std::string> flags = {"-c", "512", "--prefill-chunk", "128", "--cache-record-stride", "64",
                                          "--runtime-lane-count", "1", "--answer-prefill-idle-ms", "600000",
                                          "--one-row-class=on", "--cache-dir", dir_.string()};
  const Workload w = MakeWorkload(21);
  std::vector<int> turn = w.Prompt(0, 0);
  {
    auto first = ServerProcess::Start("llama", flags, name_ + "-rec");
    ASSERT_TRUE(first);
    const json a = Complete(*first->Client(), turn);
    // The last token sampled was never decoded into the lane.
    const std::vector<int> generated = a["tokens"].get<std::vector<int>>();
    ASSERT_EQ(generated.size(), 6u);
    turn.insert(turn.end(), generated.begin(), generated.end() - 1);
    EXPECT_EQ(first->Stop(), 0) << first->LogTail();
  }
  const size_t exchange = turn.size();
  turn.insert(turn.end(), w.questions[1].begin(), w.questions[1].end());
  auto again = ServerProcess::Start("llama", flags, name_ + "-again");
  ASSERT_TRUE(again);
  auto ref = ServerProcess::Start("llama", Flags({"--no-cache", "--one-row-class=on"}), name_ + "-ref");
  ASSERT_TRUE(ref);
  const json a = Complete(*again->Client(), turn);
  EXPECT_EQ(a["skippy"].value("cache_tier", ""), "disk") << a["skippy"].dump();
  EXPECT_EQ(a["timings"].value("cache_n", size_t{0}), exchange) << a["timings"].dump();
  const json b = Complete(*ref->Client(), turn);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["completion_probabilities"], b["completion_probabilities"]);
}

TEST_F(DiskTierFaults, TheByteCapHoldsWithEvictions) {
  // Each tiny-llama entry of 140-290 tokens is 30-70 KB; 0.0002 GiB (~215 KB) holds a few.
  auto s = ServerProcess::Start("llama", Flags({"--cache-dir", dir_.string(), "--cache-disk-gib", "0.0002"}),
                                name_ + "-cap");
  ASSERT_TRUE(s);
  auto c = s->Client();
  const Workload w = MakeWorkload(9);
  for (size_t d = 0; d < w.docs.size(); ++d) {
    for (size_t q = 0; q < 2; ++q) Complete(*c, w.Prompt(d, q));
  }
  const json before = Stats(*s);
  EXPECT_GT(before["disk"].value("evictions", 0), 0) << before.dump();
  EXPECT_EQ(s->Stop(), 0);
  uint64_t on_disk = 0;
  for (const auto& f : fs::directory_iterator(dir_ / "entries")) on_disk += fs::file_size(f.path());
  EXPECT_LE(on_disk, static_cast<uint64_t>(0.0002 * double(uint64_t{1} << 30))) << "over the cap";
  auto again = ServerProcess::Start("llama", Flags({"--cache-dir", dir_.string(), "--cache-disk-gib", "0.0002"}),
                                    name_ + "-cap2");
  ASSERT_TRUE(again);
  const json stats = Stats(*again);
  EXPECT_GT(stats["disk"].value("loaded_at_open", 0), 0) << stats.dump();
  EXPECT_LE(stats["disk"].value("bytes", uint64_t{0}), stats["disk"].value("capacity_bytes", uint64_t{0}));
}

// A server that must not start: its exit status and log.
std::pair<int, std::string> RunToExit(const std::vector<std::string>& flags, const std::string& tag) {
  const std::string log = (fs::temp_directory_path() / ("skippy-disk-refused-" + tag + ".log")).string();
  std::vector<std::string> argv = {skippy::server_test::ServerBin(), "-m", skippy::server_test::ZooFile("llama"),
                                   "--host", "127.0.0.1", "--port", std::to_string(*skippy::FreeLoopbackPort()),
                                   "-t", "1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto proc = skippy::Subprocess::Start(argv, log);
  EXPECT_TRUE(proc.ok());
  if (auto rc = proc->Wait(std::chrono::seconds(60))) return {*rc, skippy::TailOfFile(log)};
  return {proc->Stop(), skippy::TailOfFile(log)};
}

TEST_F(DiskTierFaults, ASecondServerOnTheDirectoryIsRefused) {
  auto first = ServerProcess::Start("llama", Flags({"--cache-dir", dir_.string()}), name_ + "-first");
  ASSERT_TRUE(first);
  // The second asks for a measured class: it is refused before it measures, so it never writes a
  // decision into the directory it does not own (the first, pinned, writes none).
  auto [rc, log] = RunToExit(Flags({"--cache-dir", dir_.string(), "--one-row-class=auto"}), name_);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("is in use by another process (pid " + std::to_string(first->pid())), std::string::npos) << log;
  EXPECT_EQ(log.find("lone decode step"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir_ / "one-row-class"));
  EXPECT_TRUE(first->alive());
}

TEST_F(DiskTierFaults, AnUnusableDirectoryStopsTheServerWithAClearError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "a-file") << "x";
  auto [rc, log] = RunToExit(Flags({"--cache-dir", (dir_ / "a-file" / "cache").string()}), name_);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("cannot create"), std::string::npos) << log;
}

}  // namespace
