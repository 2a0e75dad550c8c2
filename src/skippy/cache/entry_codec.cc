#include "skippy/cache/entry_codec.h"

#include <cstring>
#include <utility>

#include "skippy/common/strings.h"

namespace skippy::cache {
namespace {

constexpr uint32_t kMaxBodyBytes = 64u << 20;

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U8(uint8_t& v) { return Raw(&v, 1); }
  bool U32(uint32_t& v) { return Raw(&v, 4); }
  bool U64(uint64_t& v) { return Raw(&v, 8); }
  bool Str(std::string& s) {
    uint32_t n = 0;
    if (!U32(n) || n > in_.size() - at_) return false;
    s.assign(in_.substr(at_, n));
    at_ += n;
    return true;
  }
  bool Raw(void* p, size_t n) {
    if (n > in_.size() - at_) return false;
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
    return true;
  }
  size_t left() const { return in_.size() - at_; }

 private:
  std::string_view in_;
  size_t at_ = 0;
};

}  // namespace

std::string EncodeEntryHead(const EntryFormat& format, const EntryHead& head) {
  const PrefixRecord& r = head.record;
  Writer h;
  h.Str(head.identity);
  h.Str(r.tenant_namespace);
  h.U8(static_cast<uint8_t>(r.kind));
  h.U8(r.exact_only ? 1 : 0);
  h.U64(r.tokens.size());
  h.Raw(r.tokens.data(), r.tokens.size() * sizeof(Token));
  h.U64(r.classes.min_long());
  h.U32(static_cast<uint32_t>(r.classes.runs().size()));
  for (const BatchClasses::Run& run : r.classes.runs()) {
    h.U64(run.begin);
    h.U64(run.end);
    h.U8(run.short_rows ? 1 : 0);
  }
  h.U64(head.payload_len);
  h.U64(head.payload_hash.low);
  h.U64(head.payload_hash.high);
  if (format.with_blocks) {
    h.U32(static_cast<uint32_t>(head.blocks.size()));
    for (const PayloadBlock& b : head.blocks) {
      h.U64(b.len);
      h.U64(b.hash.low);
      h.U64(b.hash.high);
    }
  }
  Writer f;
  f.Raw(format.magic.data(), format.magic.size());
  f.U32(format.version);
  f.U32(static_cast<uint32_t>(h.out().size()));
  f.out().append(h.out());
  f.U64(Hash64(std::as_bytes(std::span(f.out().data(), f.out().size()))));
  return std::move(f.out());
}

StatusOr<uint32_t> ParseEntryPrefix(const EntryFormat& format, std::string_view prefix) {
  Reader r(prefix);
  char magic[8];
  uint32_t version = 0, body_len = 0;
  if (!r.Raw(magic, 8) || std::string_view(magic, 8) != format.magic || !r.U32(version) || !r.U32(body_len)) {
    return absl::DataLossError("not a Skippy entry");
  }
  if (version != format.version) return absl::DataLossError(StrCat("entry format version ", version));
  if (body_len > kMaxBodyBytes) return absl::DataLossError("header too large");
  return body_len;
}

StatusOr<EntryHead> ParseEntryHead(const EntryFormat& format, std::string_view head) {
  if (head.size() < kEntryPrefixBytes + kEntryHashBytes) return absl::DataLossError("short header");
  const std::string_view covered = head.substr(0, head.size() - kEntryHashBytes);
  uint64_t want = 0;
  std::memcpy(&want, head.data() + covered.size(), kEntryHashBytes);
  if (Hash64(std::as_bytes(std::span(covered.data(), covered.size()))) != want) {
    return absl::DataLossError("header checksum mismatch");
  }
  SKIPPY_ASSIGN_OR_RETURN(const uint32_t body_len, ParseEntryPrefix(format, covered.substr(0, kEntryPrefixBytes)));
  if (body_len != covered.size() - kEntryPrefixBytes) return absl::DataLossError("bad header length");
  Reader r(covered.substr(kEntryPrefixBytes));
  EntryHead h;
  uint8_t kind = 0, exact = 0;
  uint64_t n_tokens = 0, min_long = 0;
  uint32_t n_runs = 0;
  if (!r.Str(h.identity) || !r.Str(h.record.tenant_namespace) || !r.U8(kind) || !r.U8(exact) ||
      !r.U64(n_tokens) || n_tokens == 0 || n_tokens > r.left() / sizeof(Token)) {
    return absl::DataLossError("bad header");
  }
  if (kind >= kPayloadKindCount) return absl::DataLossError("bad payload kind");
  h.record.kind = static_cast<PayloadKind>(kind);
  h.record.exact_only = exact != 0;
  h.record.tokens.resize(n_tokens);
  if (!r.Raw(h.record.tokens.data(), n_tokens * sizeof(Token)) || !r.U64(min_long) || !r.U32(n_runs) ||
      n_runs > r.left() / 17) {
    return absl::DataLossError("bad header");
  }
  std::vector<BatchClasses::Run> runs(n_runs);
  for (BatchClasses::Run& run : runs) {
    uint64_t b = 0, e = 0;
    uint8_t s = 0;
    if (!r.U64(b) || !r.U64(e) || !r.U8(s)) return absl::DataLossError("bad header");
    run = {static_cast<size_t>(b), static_cast<size_t>(e), s != 0};
  }
  auto classes = BatchClasses::FromRuns(n_tokens, min_long, std::move(runs));
  if (!classes.ok()) return absl::DataLossError(std::string(classes.status().message()));
  h.record.classes = std::move(*classes);
  if (!r.U64(h.payload_len) || !r.U64(h.payload_hash.low) || !r.U64(h.payload_hash.high)) {
    return absl::DataLossError("bad header");
  }
  if (format.with_blocks) {
    uint32_t n_blocks = 0;
    if (!r.U32(n_blocks) || n_blocks > r.left() / 24) return absl::DataLossError("bad block list");
    h.blocks.resize(n_blocks);
    uint64_t total = 0;
    for (PayloadBlock& b : h.blocks) {
      if (!r.U64(b.len) || !r.U64(b.hash.low) || !r.U64(b.hash.high) || b.len == 0) {
        return absl::DataLossError("bad block list");
      }
      if (b.len > h.payload_len - total) return absl::DataLossError("blocks do not add up to the payload");
      total += b.len;  // never past payload_len, so never wraps
    }
    if (total != h.payload_len) return absl::DataLossError("blocks do not add up to the payload");
  }
  if (r.left() != 0) return absl::DataLossError("bad header");
  return h;
}

Hash128Value EntryKey(std::string_view identity, const PrefixRecord& record) {
  Writer key;
  key.Str(identity);
  key.Str(record.tenant_namespace);
  key.U8(static_cast<uint8_t>(record.kind));
  key.Raw(record.tokens.data(), record.tokens.size() * sizeof(Token));
  return Hash128(std::as_bytes(std::span(key.out().data(), key.out().size())));
}

std::string HexOf(const Hash128Value& h) { return fmt::format("{:016x}{:016x}", h.high, h.low); }

}  // namespace skippy::cache
