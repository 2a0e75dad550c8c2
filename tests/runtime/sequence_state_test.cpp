// The sequence-state parser and padder on hand-built blobs in the pinned llama.cpp layout (the
// real exports are covered by engine_test PerLaneStreams): shapes, the exact bytes of the padded
// output (cell ext with token ids, transposed V), and refusals of anything it does not recognise.
#include "skippy/runtime/sequence_state.h"

#include <gtest/gtest.h>

#include <cstring>

namespace skippy::runtime {
namespace {

class Blob {
 public:
  template <typename T>
  Blob& Put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  std::vector<uint8_t> bytes;
};

constexpr int32_t kSeq = 3;

// One KV block: `n_stream` streams, the cells in stream 1, positions first.., one byte per element,
// K rows of `row` bytes valued 10+pos, V rows (or transposed runs) valued 100+pos.
void PutBlock(Blob& b, int32_t first, uint32_t cells, bool ext, bool v_trans, uint32_t n_layer = 2, uint64_t row = 3) {
  b.Put<uint32_t>(2);  // streams
  b.Put<uint32_t>(0);  // stream 0: empty
  b.Put<uint32_t>(cells);
  for (uint32_t i = 0; i < cells; ++i) {
    b.Put<int32_t>(first + static_cast<int32_t>(i)).Put<uint32_t>(1);
    if (ext) b.Put<int32_t>(0).Put<int32_t>(0).Put<int32_t>(500 + first + static_cast<int32_t>(i));
    b.Put<int32_t>(kSeq);
  }
  b.Put<uint32_t>(v_trans ? 1 : 0).Put<uint32_t>(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) {
    b.Put<int32_t>(1).Put<uint64_t>(row);
    for (uint32_t i = 0; i < cells; ++i) {
      for (uint64_t k = 0; k < row; ++k) b.Put<uint8_t>(static_cast<uint8_t>(10 + first + i));
    }
  }
  for (uint32_t l = 0; l < n_layer; ++l) {
    if (v_trans) {
      b.Put<int32_t>(1).Put<uint32_t>(1).Put<uint32_t>(static_cast<uint32_t>(row));
      for (uint64_t j = 0; j < row; ++j) {
        for (uint32_t i = 0; i < cells; ++i) b.Put<uint8_t>(static_cast<uint8_t>(100 + first + i));
      }
    } else {
      b.Put<int32_t>(1).Put<uint64_t>(row);
      for (uint32_t i = 0; i < cells; ++i) {
        for (uint64_t k = 0; k < row; ++k) b.Put<uint8_t>(static_cast<uint8_t>(100 + first + i));
      }
    }
  }
}

Blob Header() {
  Blob b;
  b.Put<uint32_t>(0xdeadbeef).Put<int32_t>(kSeq);
  return b;
}

TEST(SequenceState, ParsesAFullAndASlidingWindowBlock) {
  Blob b = Header();
  PutBlock(b, 0, 9, false, false);
  PutBlock(b, 5, 4, false, false);
  auto shapes = ParseKvSequenceState(b.bytes);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ((*shapes)[0].first_pos, 0);
  EXPECT_EQ((*shapes)[0].cell_count, 9u);
  EXPECT_EQ((*shapes)[1].first_pos, 5);
  EXPECT_EQ((*shapes)[1].cell_count, 4u);
  EXPECT_EQ((*shapes)[1].ext_bytes, 0u);
}

// The padded blob is exactly the blob an export of the whole sequence would be, with zero data
// for the padding cells: compare with one built that way.
TEST(SequenceState, PaddingEqualsAWholeSequenceExportWithZeroData) {
  for (bool ext : {false, true}) {
    for (bool v_trans : {false, true}) {
      Blob window = Header();
      PutBlock(window, 0, 9, ext, v_trans);
      PutBlock(window, 5, 4, ext, v_trans);
      std::vector<int32_t> tokens;
      for (int32_t i = 0; i < 9; ++i) tokens.push_back(500 + i);
      auto padded = PadToPositionZero(window.bytes, tokens);
      ASSERT_TRUE(padded.ok()) << padded.status();

      Blob whole = Header();
      PutBlock(whole, 0, 9, ext, v_trans);
      Blob swa;
      PutBlock(swa, 0, 9, ext, v_trans);
      // Zero the data of cells 0..4 in the SWA block of `swa` (positions < 5).
      std::vector<uint8_t>& s = swa.bytes;
      const size_t meta = 4 + 4 + 4 + 9 * (12 + (ext ? 12 : 0));
      size_t at = meta + 8;
      for (int l = 0; l < 2; ++l) {  // K
        at += 12;
        std::memset(&s[at], 0, 5 * 3);
        at += 9 * 3;
      }
      for (int l = 0; l < 2; ++l) {  // V
        if (v_trans) {
          at += 12;
          for (int j = 0; j < 3; ++j) {
            std::memset(&s[at], 0, 5);
            at += 9;
          }
        } else {
          at += 12;
          std::memset(&s[at], 0, 5 * 3);
          at += 9 * 3;
        }
      }
      ASSERT_EQ(at, s.size());
      whole.bytes.insert(whole.bytes.end(), s.begin(), s.end());
      EXPECT_EQ(*padded, whole.bytes) << "ext " << ext << " v_trans " << v_trans;

      auto again = ParseKvSequenceState(*padded);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ((*again)[1].first_pos, 0);
      EXPECT_EQ((*again)[1].cell_count, 9u);
    }
  }
}

TEST(SequenceState, NothingToPadLeavesTheBytesAlone) {
  Blob b = Header();
  PutBlock(b, 0, 6, false, false);
  auto padded = PadToPositionZero(b.bytes, {});
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(*padded, b.bytes);
}

TEST(SequenceState, RefusesWhatItDoesNotRecognise) {
  Blob good = Header();
  PutBlock(good, 4, 3, false, false);
  // Cut short anywhere.
  for (size_t n : {size_t{0}, size_t{6}, size_t{20}, good.bytes.size() - 1}) {
    std::vector<uint8_t> cut(good.bytes.begin(), good.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(ParseKvSequenceState(cut).status().code(), absl::StatusCode::kFailedPrecondition) << n;
  }
  // Trailing bytes (a recurrent state after the KV, say).
  auto longer = good.bytes;
  longer.push_back(0);
  EXPECT_EQ(ParseKvSequenceState(longer).status().code(), absl::StatusCode::kFailedPrecondition);
  // Positions not consecutive.
  Blob gap = Header();
  gap.Put<uint32_t>(1).Put<uint32_t>(2);
  gap.Put<int32_t>(0).Put<uint32_t>(1).Put<int32_t>(kSeq);
  gap.Put<int32_t>(2).Put<uint32_t>(1).Put<int32_t>(kSeq);
  EXPECT_EQ(ParseKvSequenceState(gap.bytes).status().code(), absl::StatusCode::kFailedPrecondition);
  // Another sequence's cells.
  Blob other;
  other.Put<uint32_t>(0xdeadbeef).Put<int32_t>(kSeq + 1);
  PutBlock(other, 0, 2, false, false);
  EXPECT_EQ(ParseKvSequenceState(other.bytes).status().code(), absl::StatusCode::kFailedPrecondition);
  // Padding cells with ext need their token ids.
  Blob ext = Header();
  PutBlock(ext, 4, 3, true, false);
  EXPECT_EQ(PadToPositionZero(ext.bytes, std::vector<int32_t>{1, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Found by fuzz/state_fuzz.cc: a few hundred bytes whose block starts at a huge position, or whose
// rows run past the end, made the padder write gigabytes before it found out. Both are refused
// before a byte is written: the blob is parsed whole first, and padding needs the tokens of the
// positions it stands for.
TEST(SequenceState, PaddingIsBoundedByTheTokensAndTheBytes) {
  Blob far = Header();
  PutBlock(far, 1 << 30, 2, false, false, 1, 1 << 20);
  ASSERT_TRUE(ParseKvSequenceState(far.bytes).ok());
  EXPECT_EQ(PadToPositionZero(far.bytes, std::vector<int32_t>(16)).status().code(), absl::StatusCode::kInvalidArgument);
  Blob cut = Header();
  PutBlock(cut, 100, 2, false, false, 1, 1 << 20);
  cut.bytes.resize(cut.bytes.size() - 1);
  std::vector<int32_t> tokens(100);
  EXPECT_EQ(PadToPositionZero(cut.bytes, tokens).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace skippy::runtime
