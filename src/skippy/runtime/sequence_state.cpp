#include "skippy/runtime/sequence_state.h"

#include <cstdint>
#include <cstring>
#include <optional>

#include "skippy/common/strings.h"

namespace skippy::runtime {
namespace {

constexpr uint32_t kCellExtBytes = 12;  // llama_kv_cell_ext: i32 x, i32 y, i32 tok
constexpr uint32_t kMaxLayers = 4096;
constexpr uint64_t kMaxRowBytes = uint64_t{1} << 26;

// Reads the blob front to back; `out`, when set, receives the blob with the padding inserted.
class Walker {
 public:
  Walker(std::span<const uint8_t> in, std::vector<uint8_t>* out) : in_(in), out_(out) {}

  bool Done() const { return at_ == in_.size(); }
  size_t at() const { return at_; }

  template <typename T>
  std::optional<T> Peek(size_t offset = 0) const {
    T v;
    const size_t start = at_ + offset;
    if (start > in_.size() || in_.size() - start < sizeof(T)) return std::nullopt;
    std::memcpy(&v, in_.data() + at_ + offset, sizeof(T));
    return v;
  }
  template <typename T>
  std::optional<T> Read() {
    auto v = Peek<T>();
    if (v) at_ += sizeof(T);
    return v;
  }
  // Copies the next n input bytes to the output.
  bool Copy(size_t n) {
    if (in_.size() - at_ < n) return false;
    if (out_) out_->insert(out_->end(), in_.begin() + at_, in_.begin() + at_ + n);
    at_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (in_.size() - at_ < n) return false;
    at_ += n;
    return true;
  }
  template <typename T>
  void Emit(const T& v) {
    if (!out_) return;
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_->insert(out_->end(), p, p + sizeof(T));
  }
  void EmitZeros(size_t n) {
    if (out_) out_->insert(out_->end(), n, 0);
  }

 private:
  std::span<const uint8_t> in_;
  std::vector<uint8_t>* out_;
  size_t at_ = 0;
};

Status Malformed(size_t at, std::string_view what) {
  return absl::FailedPreconditionError(
      StrCat("sequence state not in the KV layout this build knows (byte ", at, "): ", what));
}

// Whether `cell_count` cells of `ext` ext bytes each, from the current offset, are single-sequence
// cells of `seq_id` at consecutive positions, followed by a plausible data header. Sets *first_pos.
bool CellsFit(const Walker& w, uint32_t cell_count, uint32_t ext, int32_t seq_id, int32_t* first_pos) {
  const size_t stride = 4 + 4 + ext + 4;
  for (uint32_t i = 0; i < cell_count; ++i) {
    const size_t base = i * stride;
    auto pos = w.Peek<int32_t>(base);
    auto n_seq = w.Peek<uint32_t>(base + 4);
    auto seq = w.Peek<int32_t>(base + 8 + ext);
    if (!pos || !n_seq || !seq || *n_seq != 1 || *seq != seq_id) return false;
    if (i == 0) {
      if (*pos < 0) return false;
      *first_pos = *pos;
    } else if (static_cast<int64_t>(*pos) != static_cast<int64_t>(*first_pos) + i) {  // no int32 overflow
      return false;
    }
  }
  auto v_trans = w.Peek<uint32_t>(cell_count * stride);
  auto n_layer = w.Peek<uint32_t>(cell_count * stride + 4);
  return v_trans && n_layer && *v_trans <= 1 && *n_layer >= 1 && *n_layer <= kMaxLayers;
}

// What a walk writes out (besides checking the layout): the blob as it is, or with every KV block
// padded down to position 0 (`pad`, with `tokens` for cell exts), or cut to its first `keep` cells.
struct Rewrite {
  bool pad = false;
  std::span<const int32_t> tokens;
  uint32_t keep = UINT32_MAX;
};

// One layer's rows: {i32 type, u64 row_bytes, cell_count rows}: `pad` zero rows first, then the
// first `keep` of them.
Status WalkRows(Walker& w, uint32_t cell_count, uint32_t pad, uint32_t keep) {
  auto type = w.Read<int32_t>();
  auto row = w.Read<uint64_t>();
  if (!type || !row || *type < 0 || *row == 0 || *row > kMaxRowBytes) return Malformed(w.at(), "bad row header");
  w.Emit(*type);
  w.Emit(*row);
  w.EmitZeros(static_cast<size_t>(*row) * pad);
  if (!w.Copy(static_cast<size_t>(*row) * keep) || !w.Skip(static_cast<size_t>(*row) * (cell_count - keep))) {
    return Malformed(w.at(), "rows cut short");
  }
  return absl::OkStatus();
}

// A transposed V layer: {i32 type, u32 el_bytes, u32 n_embd, n_embd runs of cell_count elements},
// each run padded and cut as WalkRows.
Status WalkTransposed(Walker& w, uint32_t cell_count, uint32_t pad, uint32_t keep) {
  auto type = w.Read<int32_t>();
  auto el = w.Read<uint32_t>();
  auto n_embd = w.Read<uint32_t>();
  if (!type || !el || !n_embd || *type < 0 || *el == 0 || *el > 16 || *n_embd == 0 || *n_embd > kMaxRowBytes) {
    return Malformed(w.at(), "bad transposed V header");
  }
  w.Emit(*type);
  w.Emit(*el);
  w.Emit(*n_embd);
  for (uint32_t j = 0; j < *n_embd; ++j) {
    w.EmitZeros(static_cast<size_t>(*el) * pad);
    if (!w.Copy(static_cast<size_t>(*el) * keep) || !w.Skip(static_cast<size_t>(*el) * (cell_count - keep))) {
      return Malformed(w.at(), "V runs cut short");
    }
  }
  return absl::OkStatus();
}

// Walks one stream with cells, rewriting it as `rw` says.
Status WalkStream(Walker& w, uint32_t cell_count, int32_t seq_id, const Rewrite& rw, KvBlockShape* shape) {
  int32_t first = 0;
  uint32_t ext = 0;
  if (!CellsFit(w, cell_count, 0, seq_id, &first)) {
    if (!CellsFit(w, cell_count, kCellExtBytes, seq_id, &first)) return Malformed(w.at(), "cells do not parse");
    ext = kCellExtBytes;
  }
  *shape = KvBlockShape{first, cell_count, ext};
  const uint32_t n_pad = rw.pad ? static_cast<uint32_t>(first) : 0;
  // Padding stands for the positions [0, first) of the sequence, whose tokens the caller has: a
  // blob whose block starts past them is refused (so a corrupt position cannot make a huge blob).
  if (n_pad > 0 && rw.tokens.size() < n_pad) {
    return absl::InvalidArgumentError(
        StrCat("padding an export to position 0 needs its first ", n_pad, " tokens, got ", rw.tokens.size()));
  }
  uint32_t keep = cell_count;
  if (rw.keep != UINT32_MAX) {
    // Cells hold positions first .. first + cell_count - 1 in order (CellsFit): the first `keep`
    // cells are positions 0 .. keep - 1 only when the block starts at 0.
    if (first != 0 || cell_count < rw.keep) {
      return absl::FailedPreconditionError(StrCat("the state holds positions ", first, "..",
                                                  first + static_cast<int64_t>(cell_count) - 1, ", not 0..",
                                                  static_cast<int64_t>(rw.keep) - 1));
    }
    keep = rw.keep;
  }
  const size_t cell_bytes = 12 + ext;
  w.Emit(keep + n_pad);
  for (uint32_t p = 0; p < n_pad; ++p) {
    w.Emit(static_cast<int32_t>(p));
    w.Emit(uint32_t{1});
    if (ext > 0) {
      w.Emit(int32_t{0});  // x, y: 2D positions, 0 for text
      w.Emit(int32_t{0});
      w.Emit(rw.tokens[p]);
    }
    w.Emit(seq_id);
  }
  if (!w.Copy(cell_bytes * keep) || !w.Skip(cell_bytes * (cell_count - keep))) {
    return Malformed(w.at(), "cells cut short");
  }
  const uint32_t v_trans = *w.Read<uint32_t>();
  const uint32_t n_layer = *w.Read<uint32_t>();
  w.Emit(v_trans);
  w.Emit(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) SKIPPY_RETURN_IF_ERROR(WalkRows(w, cell_count, n_pad, keep));
  for (uint32_t l = 0; l < n_layer; ++l) {
    SKIPPY_RETURN_IF_ERROR(v_trans ? WalkTransposed(w, cell_count, n_pad, keep) : WalkRows(w, cell_count, n_pad, keep));
  }
  return absl::OkStatus();
}

// Walks the header and up to `max_blocks` KV blocks; the rest of the bytes must be more KV blocks
// unless `end` is given, which then receives where the walk stopped.
StatusOr<std::vector<KvBlockShape>> Walk(std::span<const uint8_t> bytes, const Rewrite& rw, std::vector<uint8_t>* out,
                                         size_t max_blocks = SIZE_MAX, size_t* end = nullptr) {
  Walker w(bytes, out);
  auto magic = w.Read<uint32_t>();
  auto seq_id = w.Read<int32_t>();
  if (!magic || !seq_id) return Malformed(w.at(), "no header");
  w.Emit(*magic);
  w.Emit(*seq_id);
  std::vector<KvBlockShape> blocks;
  while (!w.Done() && blocks.size() < max_blocks) {
    auto n_stream = w.Read<uint32_t>();
    if (!n_stream || *n_stream == 0 || *n_stream > 1024) return Malformed(w.at(), "bad stream count");
    w.Emit(*n_stream);
    bool found = false;
    for (uint32_t s = 0; s < *n_stream; ++s) {
      auto cell_count = w.Read<uint32_t>();
      if (!cell_count) return Malformed(w.at(), "stream cut short");
      if (*cell_count == 0) {
        w.Emit(uint32_t{0});
        continue;
      }
      if (found) return Malformed(w.at(), "one sequence in two streams");
      found = true;
      KvBlockShape shape;
      SKIPPY_RETURN_IF_ERROR(WalkStream(w, *cell_count, *seq_id, rw, &shape));
      blocks.push_back(shape);
    }
    if (!found) return Malformed(w.at(), "a KV block without cells");
  }
  if (blocks.empty()) return Malformed(w.at(), "no KV block");
  if (end != nullptr) {
    *end = w.at();
  } else if (!w.Done()) {
    return Malformed(w.at(), "bytes after the KV blocks");
  }
  return blocks;
}

}  // namespace

StatusOr<std::vector<KvBlockShape>> ParseKvSequenceState(std::span<const uint8_t> bytes) {
  return Walk(bytes, Rewrite{}, nullptr);
}

StatusOr<std::vector<uint8_t>> PadToPositionZero(std::span<const uint8_t> bytes, std::span<const int32_t> tokens) {
  // Every count is checked against the bytes before a byte is written (the rewrite emits padding
  // ahead of the rows it then checks).
  SKIPPY_RETURN_IF_ERROR(Walk(bytes, Rewrite{}, nullptr).status());
  std::vector<uint8_t> out;
  out.reserve(bytes.size());
  auto blocks = Walk(bytes, Rewrite{.pad = true, .tokens = tokens}, &out);
  if (!blocks.ok()) return blocks.status();
  return out;
}

StatusOr<size_t> HybridRecurrentOffset(std::span<const uint8_t> bytes) {
  size_t end = 0;
  auto blocks = Walk(bytes, Rewrite{}, nullptr, /*max_blocks=*/1, &end);
  if (!blocks.ok()) return blocks.status();
  if (end == bytes.size()) return Malformed(end, "no recurrent state after the KV block");
  return end;
}

StatusOr<std::vector<uint8_t>> HybridStateAt(std::span<const uint8_t> later, size_t n_tokens,
                                             std::span<const uint8_t> recurrent_part) {
  if (recurrent_part.size() <= kStateHeaderBytes) {
    return absl::InvalidArgumentError("no recurrent state in the partial export");
  }
  if (n_tokens == 0 || n_tokens >= UINT32_MAX) return absl::InvalidArgumentError(StrCat("a state of ", n_tokens, " tokens"));
  if (later.size() < kStateHeaderBytes || std::memcmp(later.data(), recurrent_part.data(), kStateHeaderBytes) != 0) {
    return absl::InvalidArgumentError("the partial export is of another sequence");
  }
  std::vector<uint8_t> out;
  out.reserve(later.size());
  size_t end = 0;
  auto blocks = Walk(later, Rewrite{.pad = false, .tokens = {}, .keep = static_cast<uint32_t>(n_tokens)}, &out,
                     /*max_blocks=*/1, &end);
  if (!blocks.ok()) return blocks.status();
  if (end == later.size()) return Malformed(end, "no recurrent state after the KV block");
  out.insert(out.end(), recurrent_part.begin() + kStateHeaderBytes, recurrent_part.end());
  return out;
}

StatusOr<std::vector<uint8_t>> RecurrentPartOfHybridState(std::span<const uint8_t> bytes) {
  SKIPPY_ASSIGN_OR_RETURN(const size_t at, HybridRecurrentOffset(bytes));
  std::vector<uint8_t> out(bytes.begin(), bytes.begin() + kStateHeaderBytes);
  out.insert(out.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end());
  return out;
}

}  // namespace skippy::runtime
