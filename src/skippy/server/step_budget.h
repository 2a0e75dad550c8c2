// Step budget: how many prompt rows a prefill may run before the decoding lanes' next tokens, so
// that each of them keeps its time per output token within an SLO (skippy-server --tpot-slo-ms).
//
// Rule: a lane that has streamed g tokens, the first at t1, keeps its mean time per output token
// (what a client measures: (t_last - t1) / (tokens - 1), and what goodput counts) within the SLO
// as long as its next token is out by t1 + g * SLO. Its allowance is what is left of that now;
// the prefill may take the smallest allowance of the decoding lanes, less what their decode step
// is expected to take, at the prefill's measured cost per row, and always a smallest piece
// (min_rows), so that a prompt advances. A lane that has been faster than the SLO so far lends its
// slack to the prefill (a burst of prompts starts sooner). A lane behind its allowance gets the
// smallest piece only, and makes up the deficit on its later tokens, as long as it can still meet
// the SLO by its last one (max_tokens, decoding at the measured step with a smallest piece beside
// each step). A lane that cannot is late whatever the prefill does, so it bounds nothing: cutting
// the prefill would make the prompt later without saving the lane (under overload, with every lane
// late, the prefill runs as without an SLO). Costs are the server's own timings (CostEstimate), so
// the bound follows the model, the CPU and the load.
//
// With a TTFT target too (skippy-server --ttft-slo-ms), the prompt weighs in: one that can still
// get its first token out in time at full speed, and would not once the decode steps between its
// pieces are added, keeps its batch whole (TtftOutranksTpot); one that is late anyway is cut, since
// its target is lost already and the decoding lanes' are not.
//
// Where the bound cuts a planned batch, it is cut only where both pieces keep a whole batch of
// their class (LaneCache::CutBatch): the startup batch-split check proves that a row's bits do
// not depend on such cuts, so the bound changes when a token comes, never what it is.
//
// Thread-safety: PrefillRowsWithinTpot and TtftOutranksTpot are pure functions; a CostEstimate is a
// value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace skippy::server {

// A decoding lane's clock: tokens streamed so far (at least 1), the time since the first, and how
// many more it may stream (its max_tokens less those).
struct DecodingLaneClock {
  int64_t emitted = 1;
  double since_first_ms = 0;
  int64_t remaining = 0;
};

// The rows a prefill may run now (the rule above; at least min_rows); nullopt when nothing bounds
// it: no SLO (tpot_slo_ms <= 0), no cost per row known yet, or no decoding lane that this step can
// keep on time. decode_ms: what the decoding lanes' next step is expected to take.
std::optional<size_t> PrefillRowsWithinTpot(double tpot_slo_ms, std::span<const DecodingLaneClock> lanes,
                                            double decode_ms, double row_ms, size_t min_rows);

// Whether a prompt with ttft_left_ms to its first-token deadline and rows_left rows to prefill
// (at row_ms a row) keeps its batch whole: it is on time at full speed, and cut into pieces of
// piece_rows with a decode step of decode_ms after each, it would not be.
bool TtftOutranksTpot(double ttft_left_ms, size_t rows_left, size_t piece_rows, double row_ms, double decode_ms);

// A cost per unit (milliseconds per prompt row, per decoding lane) from timed work: sums that
// decay by kKeep at each sample, so the estimate follows a machine that speeds up or slows down
// within a few dozen samples.
class CostEstimate {
 public:
  static constexpr double kKeep = 0.9;
  void Add(double ms, double units) {
    if (units <= 0 || ms < 0) return;
    ms_ = kKeep * ms_ + ms;
    units_ = kKeep * units_ + units;
  }
  // 0 until a sample came.
  double per_unit() const { return units_ > 0 ? ms_ / units_ : 0; }

 private:
  double ms_ = 0;
  double units_ = 0;
};

}  // namespace skippy::server
