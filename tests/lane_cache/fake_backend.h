// FakeBackend: a LaneBackend without llama.cpp. Each lane holds the token ids of its attention
// cells and a recurrent state that is a hash chain over every token it consumed, so a test can
// check that a restored lane holds exactly what a recompute of the same prefix would.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "skippy/lane_cache/lane_backend.h"

namespace skippy::lane_cache::testing {

class FakeBackend final : public LaneBackend {
 public:
  enum class Kind { kDense, kSlidingWindow, kHybrid, kRecurrent, kUncertified };
  static constexpr size_t kHeader = 8;
  static constexpr int32_t kVocab = 32768;
  static constexpr uint64_t kDecodedTaint = 0x5deece66dULL;

  FakeBackend(Kind kind, uint32_t lanes = 2, size_t min_batch = 2, int32_t n_swa = 32) : kind_(kind), lanes_(lanes) {
    f_.family.enabled = kind != Kind::kUncertified;
    f_.family.family_key = "fake";
    const bool recurrent = kind == Kind::kHybrid || kind == Kind::kRecurrent;
    f_.family.payload = recurrent ? cache::PayloadKind::kKvRecurrent : cache::PayloadKind::kResidentKv;
    f_.hybrid_memory = kind == Kind::kHybrid;
    f_.n_swa = kind == Kind::kSlidingWindow ? n_swa : 0;
    f_.swa_full = true;
    f_.min_exact_batch = min_batch;
    f_.lane_count = lanes;
    f_.state_header_bytes = kHeader;
    f_.identity.model_id = "fake-model";
    f_.identity.layer_end = 1;
    f_.identity.runtime_abi = "fake";
    f_.identity.n_ctx = 4096;
    f_.identity.n_vocab = kVocab;
  }

  // The recurrent state after consuming `tokens` from an empty lane.
  static uint64_t Chain(std::span<const Token> tokens, uint64_t r = 0) {
    for (Token t : tokens) r = r * 1000003u + static_cast<uint64_t>(t) + 1;
    return r;
  }
  // What a prefill does: appends tokens to the lane.
  void Append(int32_t lane, std::span<const Token> tokens) {
    Lane& l = lanes_[lane];
    l.kv.insert(l.kv.end(), tokens.begin(), tokens.end());
    l.recurrent = Chain(tokens, l.recurrent);
  }
  // What a one-row decode step does (a generated token): its cell and the state after it are of
  // another batch class than a prompt row's, which the fake marks (a negative cell, a tainted chain),
  // except with a smallest exact batch of 1 (the one-row class), where they are a prompt row's.
  void AppendDecoded(int32_t lane, Token t) {
    if (f_.min_exact_batch == 1) return Append(lane, std::span(&t, 1));
    Lane& l = lanes_[lane];
    l.kv.push_back(-1 - t);
    l.recurrent = Chain(std::span(&t, 1), l.recurrent) ^ kDecodedTaint;
  }
  const std::vector<Token>& kv(int32_t lane) const { return lanes_[lane].kv; }
  uint64_t recurrent(int32_t lane) const { return lanes_[lane].recurrent; }
  bool recurrent_kind() const { return kind_ == Kind::kHybrid || kind_ == Kind::kRecurrent; }
  void FailImports(bool fail) { fail_imports_ = fail; }
  int exports() const { return exports_; }
  // Batches through Prefill, and their rows.
  int prefills() const { return prefills_; }
  size_t prefill_rows() const { return prefill_rows_; }

  const BackendFacts& facts() const override { return f_; }
  int32_t SequenceLength(int32_t lane) const override { return static_cast<int32_t>(lanes_[lane].kv.size()); }
  int32_t SequenceFirstPosition(int32_t lane) const override { return lanes_[lane].kv.empty() ? -1 : 0; }
  int32_t PaddedPrefix(int32_t lane) const override { return lanes_[lane].padded; }
  Status Clear(int32_t lane) override {
    lanes_[lane] = Lane{};
    return absl::OkStatus();
  }
  Status Truncate(int32_t lane, int32_t n) override {
    Lane& l = lanes_[lane];
    if (n > static_cast<int32_t>(l.kv.size())) return absl::InvalidArgumentError("truncate past the end");
    if (n < static_cast<int32_t>(l.kv.size()) && recurrent_kind()) {
      return absl::FailedPreconditionError("recurrent memory cannot be cut");
    }
    if (n > 0 && n < l.padded) return absl::FailedPreconditionError("cut into a padded import");
    l.kv.resize(static_cast<size_t>(n));
    return absl::OkStatus();
  }
  Status Prefill(int32_t lane, std::span<const Token> tokens, int32_t pos0) override {
    if (pos0 != SequenceLength(lane)) return absl::InvalidArgumentError("prefill not at the lane's end");
    if (tokens.size() < f_.min_exact_batch) return absl::InvalidArgumentError("a batch below the smallest exact batch");
    Append(lane, tokens);
    ++prefills_;
    prefill_rows_ += tokens.size();
    return absl::OkStatus();
  }
  StatusOr<std::vector<uint8_t>> ExportResident(int32_t lane) override {
    ++exports_;
    if (recurrent_kind()) return absl::FailedPreconditionError("not ResidentKv");
    if (lanes_[lane].kv.empty()) return absl::FailedPreconditionError("empty lane");
    std::vector<uint8_t> out(kHeader);
    PutTokens(out, lanes_[lane].kv);
    return out;
  }
  Status ImportResident(std::span<const uint8_t> bytes, int32_t lane, std::span<const Token> tokens) override {
    (void)Clear(lane);
    if (fail_imports_) return absl::DataLossError("import refused (test)");
    size_t at = kHeader;
    std::vector<Token> kv = GetTokens(bytes, at);
    if (kind_ == Kind::kSlidingWindow && kv.size() > static_cast<size_t>(f_.n_swa)) {
      lanes_[lane].padded = static_cast<int32_t>(kv.size());
    }
    lanes_[lane].kv = std::move(kv);
    return absl::OkStatus();
  }
  StatusOr<std::vector<uint8_t>> ExportState(int32_t lane, cache::PayloadKind kind) override {
    ++exports_;
    if (!recurrent_kind()) return absl::FailedPreconditionError("no recurrent state");
    std::vector<uint8_t> out(kHeader);
    if (kind != cache::PayloadKind::kRecurrentOnly) PutTokens(out, lanes_[lane].kv);
    PutU64(out, lanes_[lane].recurrent);
    return out;
  }
  Status ImportState(std::span<const uint8_t> bytes, int32_t lane, cache::PayloadKind kind) override {
    (void)Clear(lane);
    if (fail_imports_) return absl::DataLossError("import refused (test)");
    size_t at = kHeader;
    lanes_[lane].kv = GetTokens(bytes, at);
    lanes_[lane].recurrent = GetU64(bytes, at);
    return absl::OkStatus();
  }
  Status RestoreRecurrentOnto(std::span<const uint8_t> part, int32_t lane, int32_t n) override {
    Lane& l = lanes_[lane];
    if (static_cast<int32_t>(l.kv.size()) < n) return absl::FailedPreconditionError("lane holds fewer tokens");
    size_t at = kHeader;
    l.recurrent = GetU64(part, at);
    l.kv.resize(static_cast<size_t>(n));
    ++onto_restores_;
    return absl::OkStatus();
  }
  StatusOr<size_t> RecurrentOffset(std::span<const uint8_t> state) const override {
    size_t at = kHeader;
    (void)GetTokens(state, at);
    return at;
  }
  StatusOr<std::vector<uint8_t>> StateAt(std::span<const uint8_t> later, size_t n,
                                         std::span<const uint8_t> part) const override {
    size_t at = kHeader;
    std::vector<Token> kv = GetTokens(later, at);
    if (kv.size() < n) return absl::FailedPreconditionError("later export is shorter");
    kv.resize(n);
    std::vector<uint8_t> out(kHeader);
    PutTokens(out, kv);
    size_t p = kHeader;
    PutU64(out, GetU64(part, p));
    return out;
  }
  int onto_restores() const { return onto_restores_; }

 private:
  struct Lane {
    std::vector<Token> kv;
    uint64_t recurrent = 0;
    int32_t padded = 0;
  };
  static void PutU64(std::vector<uint8_t>& out, uint64_t v) {
    const size_t at = out.size();
    out.resize(at + 8);
    std::memcpy(out.data() + at, &v, 8);
  }
  static uint64_t GetU64(std::span<const uint8_t> in, size_t& at) {
    uint64_t v = 0;
    std::memcpy(&v, in.data() + at, 8);
    at += 8;
    return v;
  }
  static void PutTokens(std::vector<uint8_t>& out, const std::vector<Token>& t) {
    PutU64(out, t.size());
    const size_t at = out.size();
    out.resize(at + t.size() * sizeof(Token));
    std::memcpy(out.data() + at, t.data(), t.size() * sizeof(Token));
  }
  static std::vector<Token> GetTokens(std::span<const uint8_t> in, size_t& at) {
    const size_t n = GetU64(in, at);
    std::vector<Token> t(n);
    std::memcpy(t.data(), in.data() + at, n * sizeof(Token));
    at += n * sizeof(Token);
    return t;
  }

  Kind kind_;
  BackendFacts f_;
  std::vector<Lane> lanes_;
  bool fail_imports_ = false;
  int exports_ = 0;
  int onto_restores_ = 0;
  int prefills_ = 0;
  size_t prefill_rows_ = 0;
};

}  // namespace skippy::lane_cache::testing
