// The entry head codec shared by the disk and shared tiers: a head reads back as written, and a
// head whose block list does not add up to its payload is refused, however its lengths overflow.
#include "skippy/cache/entry_codec.h"

#include <gtest/gtest.h>

#include <limits>

#include "test_util.h"

namespace skippy::cache {
namespace {

constexpr EntryFormat kBlocks{"SKPYTST1", 1, /*with_blocks=*/true};

EntryHead Head(uint64_t payload_len, std::vector<uint64_t> block_lens) {
  EntryHead h;
  h.identity = "identity";
  h.record.tokens = testing::Range(0, 40);
  h.record.classes = BatchClasses::Of(40, {}, 32);
  h.payload_len = payload_len;
  h.payload_hash = {1, 2};
  for (size_t i = 0; i < block_lens.size(); ++i) h.blocks.push_back({block_lens[i], {i, i + 1}});
  return h;
}

TEST(EntryCodec, AHeadWithBlocksReadsBackAsWritten) {
  const EntryHead h = Head(10000, {4096, 4096, 1808});
  auto back = ParseEntryHead(kBlocks, EncodeEntryHead(kBlocks, h));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->identity, h.identity);
  EXPECT_EQ(back->record.tokens, h.record.tokens);
  EXPECT_TRUE(back->record.classes == h.record.classes);
  EXPECT_EQ(back->payload_len, h.payload_len);
  ASSERT_EQ(back->blocks.size(), 3u);
  EXPECT_EQ(back->blocks[2].len, 1808u);
  EXPECT_EQ(back->blocks[2].hash, (Hash128Value{2, 3}));
}

TEST(EntryCodec, BlocksThatDoNotAddUpToThePayloadAreRefused) {
  EXPECT_EQ(ParseEntryHead(kBlocks, EncodeEntryHead(kBlocks, Head(10000, {4096, 4096}))).status().code(),
            absl::StatusCode::kDataLoss);
  // 2^64 - 1 + 2 wraps to 1: a sum taken without care matches a 1-byte payload, and a reader that
  // trusts the first block's length allocates 16 EiB.
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(ParseEntryHead(kBlocks, EncodeEntryHead(kBlocks, Head(1, {huge, 2}))).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseEntryHead(kBlocks, EncodeEntryHead(kBlocks, Head(huge, {huge}))).status().code(),
            absl::StatusCode::kOk);  // one block of the payload's length adds up: the reader checks replies
}

}  // namespace
}  // namespace skippy::cache
