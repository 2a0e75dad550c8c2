#include "skippy/certify/batch_split.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "skippy/cache/batch_classes.h"
#include "skippy/cache/payload_kind.h"
#include "skippy/certify/logits.h"
#include "skippy/certify/state_handoff.h"
#include "skippy/common/strings.h"

namespace skippy::certify {

namespace {

using runtime::Token;

// Splits every piece longer than n_batch into the fewest equal pieces of at most n_batch rows
// (what Engine::Decode and the server's plan would do), so a cut of pieces >= m stays >= m when
// n_batch >= 2m.
std::vector<size_t> FitBatch(const std::vector<size_t>& cut, size_t n_batch) {
  std::vector<size_t> out;
  for (size_t p : cut) {
    const size_t k = (p + n_batch - 1) / n_batch;
    size_t at = 0;
    for (size_t i = 1; i <= k; ++i) {
      const size_t end = p * i / k;
      out.push_back(end - at);
      at = end;
    }
  }
  return out;
}

// Cuts drawn from a fixed seed (the same on every run, so a failure reproduces) that put batches
// of min_batch + 0..7 rows, every residue modulo 8, at the start, in the middle and at the end of
// the prompt, with batches of random (often odd) length between them: kernels that take rows in
// groups (4, 8, 16) and treat the remainder another way give such rows other bits.
std::vector<std::vector<size_t>> RandomCuts(size_t n, size_t m, size_t count) {
  if (n < 2 * m) return {};  // no room for two batches of m rows (the caller ensures 5m)
  std::mt19937 rng(0x5eed);
  std::vector<size_t> residues = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<std::vector<size_t>> out;
  size_t next_residue = residues.size();
  for (size_t c = 0; c < count; ++c) {
    // Short batches: as many of 4 as leave room for two long ones of at least m rows.
    const size_t n_short = std::min<size_t>(4, (n - 2 * m) / (m + 7));
    std::vector<size_t> shorts;
    for (size_t i = 0; i < n_short; ++i) {
      if (next_residue == residues.size()) {
        std::shuffle(residues.begin(), residues.end(), rng);
        next_residue = 0;
      }
      shorts.push_back(m + residues[next_residue++]);
    }
    size_t rest = n;
    for (size_t p : shorts) rest -= p;
    // Two long batches between the short ones: a random split of the rest, each at least m.
    const size_t a = m + std::uniform_int_distribution<size_t>(0, rest - 2 * m)(rng);
    std::vector<size_t> longs = {a, rest - a};
    // Layout: short, long, short..., long, short (the first short at the start, the last at the end).
    std::vector<size_t> cut;
    size_t si = 0;
    if (si < shorts.size()) cut.push_back(shorts[si++]);
    cut.push_back(longs[0]);
    while (si + 1 < shorts.size()) cut.push_back(shorts[si++]);
    cut.push_back(longs[1]);
    if (si < shorts.size()) cut.push_back(shorts[si++]);
    out.push_back(std::move(cut));
  }
  return out;
}

}  // namespace

nlohmann::json BatchSplitReport::ToJson() const {
  nlohmann::json j = {{"min_batch", min_batch}, {"n_tokens", n_tokens}, {"pass", pass}, {"cuts", nlohmann::json::array()}};
  for (size_t i = 0; i < cuts.size(); ++i) {
    j["cuts"].push_back({{"batches", cuts[i]}, {"prompt_logits_equal", bool(prompt_equal[i])},
                         {"state_equal", bool(state_equal[i])}, {"decode_logits_equal", bool(decode_equal[i])}});
  }
  if (!short_cuts.empty()) {
    j["short_cuts"] = nlohmann::json::array();
    for (size_t i = 0; i < short_cuts.size(); ++i) {
      j["short_cuts"].push_back({{"batches", short_cuts[i]}, {"prompt_logits_equal", bool(short_prompt_equal[i])},
                                 {"state_equal", bool(short_state_equal[i])},
                                 {"decode_logits_equal", bool(short_decode_equal[i])}});
    }
  }
  return j;
}

namespace {

struct CutResults {
  std::vector<std::vector<size_t>> cuts;
  std::vector<bool> prompt_equal, state_equal, decode_equal;
  bool pass() const {
    auto all = [](const std::vector<bool>& v) { return std::all_of(v.begin(), v.end(), [](bool b) { return b; }); };
    return all(prompt_equal) && all(state_equal) && all(decode_equal);
  }
};

// Prefills `tokens` under each cut (cuts[0] the reference), decodes one more token after each, and
// compares both logits and the sequence's whole state after the prefill (every position's K and V,
// recurrent state) with the reference's. The state catches a row computed in other bits that the
// logits can hide: a product that re-quantizes its input to 8 bits (K-quant and IQ weights) often
// rounds a last-bit difference away, and it then surfaces only on another prompt.
StatusOr<CutResults> RunCuts(runtime::Engine& engine, int32_t lane, std::span<const Token> tokens,
                             const std::vector<std::vector<size_t>>& cuts) {
  CutResults r;
  std::vector<float> ref_prompt, ref_decode;
  std::vector<uint8_t> ref_state;
  Token next = 0;
  for (const auto& cut : cuts) {
    SKIPPY_RETURN_IF_ERROR(engine.Clear(lane));
    size_t pos = 0;
    std::vector<float> logits;
    for (size_t len : cut) {
      SKIPPY_ASSIGN_OR_RETURN(logits, engine.Decode(lane, tokens.subspan(pos, len), static_cast<int32_t>(pos)));
      pos += len;
    }
    if (r.cuts.empty()) next = Argmax(logits);
    SKIPPY_ASSIGN_OR_RETURN(std::vector<uint8_t> state, engine.ExportState(lane, cache::PayloadKind::kFullState));
    SKIPPY_ASSIGN_OR_RETURN(std::vector<float> after, engine.Decode(lane, std::span(&next, 1), static_cast<int32_t>(pos)));
    if (r.cuts.empty()) {
      ref_prompt = logits;
      ref_decode = after;
      ref_state = state;
    }
    r.cuts.push_back(cut);
    r.prompt_equal.push_back(BytesEqual(ref_prompt, logits));
    r.state_equal.push_back(state == ref_state);
    r.decode_equal.push_back(BytesEqual(ref_decode, after));
  }
  return r;
}

StatusOr<BatchSplitReport> RunAllCuts(runtime::Engine& engine, int32_t lane, size_t m, size_t n, size_t n_batch) {
  SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> tokens,
                          BenchmarkTokens(engine.model(), "Batch split check: the same prompt cut in other places.",
                                          static_cast<int32_t>(n)));
  BatchSplitReport r;
  r.min_batch = m;
  r.n_tokens = n;
  std::vector<std::vector<size_t>> cuts;
  for (const auto& c : std::vector<std::vector<size_t>>{
           {n}, {n - m, m}, {m, n - 2 * m, m}, {n / 2, n - n / 2}, {n / 3, m, n - n / 3 - m}}) {
    cuts.push_back(FitBatch(c, n_batch));
  }
  for (const auto& c : RandomCuts(n, m, kRandomCuts)) cuts.push_back(FitBatch(c, n_batch));
  SKIPPY_ASSIGN_OR_RETURN(CutResults whole, RunCuts(engine, lane, tokens, cuts));
  r.pass = whole.pass();
  r.cuts = std::move(whole.cuts);
  r.prompt_equal = std::move(whole.prompt_equal);
  r.state_equal = std::move(whole.state_equal);
  r.decode_equal = std::move(whole.decode_equal);
  if (m > cache::BatchClasses::kMinShortBatch) {
    // A short run after a long one (cache::BatchClasses): its rows (as many as the longest short
    // batch) in one short batch or cut into other short batches of 2+ rows.
    const size_t s = m - 1;
    const size_t two = cache::BatchClasses::kMinShortBatch;
    const std::vector<size_t> head = FitBatch({n - s}, n_batch);
    std::vector<std::vector<size_t>> tails = {{s}, {s / 2, s - s / 2}, {two, s - two}, {s - two, two},
                                              {s / 3, s / 3, s - 2 * (s / 3)}};
    std::vector<std::vector<size_t>> short_cuts;
    for (const auto& t : tails) {
      if (std::any_of(t.begin(), t.end(), [&](size_t p) { return p < two; })) continue;
      std::vector<size_t> c = head;
      c.insert(c.end(), t.begin(), t.end());
      short_cuts.push_back(std::move(c));
    }
    SKIPPY_ASSIGN_OR_RETURN(CutResults tail, RunCuts(engine, lane, tokens, short_cuts));
    r.pass = r.pass && tail.pass();
    r.short_cuts = std::move(tail.cuts);
    r.short_prompt_equal = std::move(tail.prompt_equal);
    r.short_state_equal = std::move(tail.state_equal);
    r.short_decode_equal = std::move(tail.decode_equal);
  }
  return r;
}

}  // namespace

StatusOr<BatchSplitReport> CheckBatchSplits(runtime::Engine& engine, int32_t lane, size_t min_batch) {
  if (min_batch == 0) return absl::InvalidArgumentError("min_batch must be at least 1");
  const size_t m = min_batch;
  const size_t n_batch = engine.context().options().n_batch;
  if (n_batch < 2 * m) {
    return absl::InvalidArgumentError(StrCat("n_batch ", n_batch, " is below twice the smallest batch ", m));
  }
  // 160 tokens, or five smallest batches if more (320 with flash attention on); fewer if the
  // lane's context is smaller, but never fewer than five smallest batches.
  const size_t per_lane = engine.context().options().n_ctx / std::max<uint32_t>(1, engine.lane_count() + engine.cache_seq_count());
  const size_t n = std::min(std::max<size_t>(160, 5 * m), per_lane > 0 ? per_lane - 1 : 0);
  if (n < 5 * m) {
    return absl::InvalidArgumentError(StrCat("the context holds ", per_lane, " tokens per lane; the check needs ", 5 * m + 1));
  }
  SKIPPY_RETURN_IF_ERROR(engine.Clear(lane));
  auto r = RunAllCuts(engine, lane, m, n, n_batch);
  (void)engine.Clear(lane);  // also after a failed decode: the lane is left empty either way
  return r;
}

}  // namespace skippy::certify
