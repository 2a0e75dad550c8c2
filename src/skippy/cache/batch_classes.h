// BatchClasses: which rows of a prompt a prefill computes in short batches and which in long ones,
// so a restored prefix and the rows prefilled after it carry the same bits as a recompute.
//
// A backend may compute a row differently by the size of the batch it is in: llama.cpp's CPU
// flash attention takes a tiled path from 64 query rows and a row-by-row path below. Within each
// size class a row's result depends on nothing else about the batch (measured: the runtime's
// batch-split check). Without such a split (min_long <= kMinShortBatch) every prompt is one long
// run and a batch needs only min_long rows; the rest of this header is about the split case.
//
// Rule: a prompt's rows are cut into segments at its segment ends (the server passes chat-message
// ends; a raw prompt has none and is one segment); a segment shorter than min_long rows is short, the rest long;
// consecutive segments of one class form a run; a short run of min_long rows or more, or of one
// row next to a long one, is long after all (and merges with its neighbours). So a short run is a
// few short messages or lines between long ones or at the end, under min_long rows. Long runs are
// prefilled in batches of min_long or more rows, short runs in batches of kMinShortBatch or more,
// and no batch crosses a run. The classes are a function of the prompt and its segment ends only,
// never of what the cache holds, so a --no-cache server computes every row in the class a cache
// hit computes it in. The price: a short run is its own batch on a miss. The gain: a hit at the
// end of a long segment prefills only the short ones after it, as llama-server does, with flash
// attention on. When the conversation grows, a short run that reaches min_long rows turns long,
// and a hit then restores only up to its start.
//
// A stored prefix may serve a prompt only up to the first row whose class differs (the same
// tokens sent as a chat and as a raw prompt are classed differently), and only where the rest of
// its run still holds one batch of its class (CanStartAt).
//
// Thread-safety: a value type; const methods are pure.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "skippy/common/status.h"

namespace skippy::cache {

class BatchClasses {
 public:
  static constexpr size_t kMinShortBatch = 2;  // a one-row batch is a class of its own

  struct Run {
    size_t begin = 0;
    size_t end = 0;
    bool short_rows = false;
    bool operator==(const Run&) const = default;
  };

  BatchClasses() = default;
  // n_rows: the prompt length; message_ends: token offsets where chat messages end (any order;
  // offsets outside (0, n_rows) are ignored); min_long: the smallest batch of the long class.
  static BatchClasses Of(size_t n_rows, std::span<const size_t> message_ends, size_t min_long);
  // Classes read back from storage (runs() of a stored value). InvalidArgument unless the runs
  // cover [0, n_rows) in order with no empty run and no two neighbours of one class.
  [[nodiscard]] static StatusOr<BatchClasses> FromRuns(size_t n_rows, size_t min_long, std::vector<Run> runs);

  friend bool operator==(const BatchClasses&, const BatchClasses&) = default;

  size_t size() const { return n_; }
  size_t min_long() const { return min_long_; }
  const std::vector<Run>& runs() const { return runs_; }  // cover [0, size()) in order
  bool has_short_runs() const;
  // The classes of rows [0, n) (an entry that holds the first n rows of this prompt).
  BatchClasses Prefix(size_t n) const;
  // Rows [0, result) are in the same class here and in `other`; result <= min of both sizes.
  size_t AgreesUpTo(const BatchClasses& other) const;
  // Whether a prefill may start at row `at` (a restored prefix of `at` rows): 0 < at < size() and
  // the rest of its run holds one batch of its class (or `at` starts the run).
  bool CanStartAt(size_t at) const;
  // The largest at <= limit with CanStartAt(at); 0 if none.
  size_t LastStartAtOrBelow(size_t limit) const;
  // The batches that prefill rows [from, size()): every run boundary past `from` is a cut, and so is
  // each of `stops` (ascending) that leaves a whole batch of its class on both sides within its run
  // and after the previous cut; each stretch between cuts is split into the fewest equal batches of
  // at most max_long rows (long runs; max_long >= 2 * min_long) or min_long - 1 rows (short runs).
  // REQUIRES: from == 0 or CanStartAt(from).
  struct Cuts {
    std::vector<size_t> batch_ends;  // ascending, last == size() (empty when from >= size())
    std::vector<size_t> stops;       // the stops kept (a subset of batch_ends)
  };
  Cuts Cut(size_t from, std::span<const size_t> stops, size_t max_long) const;
  // "" without short runs, else the short runs as "begin-end,..." (tells two classings apart).
  std::string Fingerprint() const;

 private:
  size_t MinBatchOf(const Run& r) const { return r.short_rows ? kMinShortBatch : min_long_; }
  const Run* RunAt(size_t row) const;

  size_t n_ = 0;
  size_t min_long_ = kMinShortBatch;
  std::vector<Run> runs_;
};

}  // namespace skippy::cache
