#include "skippy/cache/batch_classes.h"

#include <algorithm>

#include "skippy/common/strings.h"

namespace skippy::cache {

BatchClasses BatchClasses::Of(size_t n_rows, std::span<const size_t> message_ends, size_t min_long) {
  BatchClasses c;
  c.n_ = n_rows;
  c.min_long_ = std::max<size_t>(1, min_long);
  if (n_rows == 0) return c;
  if (c.min_long_ <= kMinShortBatch) {
    c.runs_.push_back({0, n_rows, false});
    return c;
  }
  std::vector<size_t> ends;
  for (size_t e : message_ends) {
    if (e > 0 && e < n_rows) ends.push_back(e);
  }
  ends.push_back(n_rows);
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  // Segments by message, classed by length; neighbours of one class merge.
  std::vector<Run> runs;
  size_t at = 0;
  for (size_t e : ends) {
    const bool is_short = e - at < c.min_long_;
    if (!runs.empty() && runs.back().short_rows == is_short) {
      runs.back().end = e;
    } else {
      runs.push_back({at, e, is_short});
    }
    at = e;
  }
  // A short run of min_long rows or more is long (a document of short lines prefills in long
  // batches), and a one-row short run would be a one-row batch: it joins its long neighbours.
  for (Run& r : runs) {
    const size_t len = r.end - r.begin;
    if (r.short_rows && (len >= c.min_long_ || (len == 1 && runs.size() > 1))) r.short_rows = false;
  }
  for (const Run& r : runs) {
    if (!c.runs_.empty() && c.runs_.back().short_rows == r.short_rows) {
      c.runs_.back().end = r.end;
    } else {
      c.runs_.push_back(r);
    }
  }
  return c;
}

StatusOr<BatchClasses> BatchClasses::FromRuns(size_t n_rows, size_t min_long, std::vector<Run> runs) {
  if (min_long == 0) return absl::InvalidArgumentError("batch classes: min_long is 0");
  size_t at = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    if (r.begin != at || r.end <= r.begin || (i > 0 && runs[i - 1].short_rows == r.short_rows)) {
      return absl::InvalidArgumentError(StrCat("batch classes: run ", i, " does not continue the runs before it"));
    }
    at = r.end;
  }
  if (at != n_rows) return absl::InvalidArgumentError("batch classes: the runs do not cover the rows");
  BatchClasses c;
  c.n_ = n_rows;
  c.min_long_ = min_long;
  c.runs_ = std::move(runs);
  return c;
}

bool BatchClasses::has_short_runs() const {
  return std::any_of(runs_.begin(), runs_.end(), [](const Run& r) { return r.short_rows; });
}

BatchClasses BatchClasses::Prefix(size_t n) const {
  BatchClasses c;
  c.n_ = std::min(n, n_);
  c.min_long_ = min_long_;
  for (const Run& r : runs_) {
    if (r.begin >= c.n_) break;
    c.runs_.push_back({r.begin, std::min(r.end, c.n_), r.short_rows});
  }
  return c;
}

size_t BatchClasses::AgreesUpTo(const BatchClasses& other) const {
  const size_t limit = std::min(n_, other.n_);
  size_t p = 0, i = 0, j = 0;
  while (p < limit) {
    while (runs_[i].end <= p) ++i;
    while (other.runs_[j].end <= p) ++j;
    if (runs_[i].short_rows != other.runs_[j].short_rows) return p;
    p = std::min(runs_[i].end, other.runs_[j].end);
  }
  return limit;
}

const BatchClasses::Run* BatchClasses::RunAt(size_t row) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), row, [](size_t r, const Run& run) { return r < run.end; });
  return it == runs_.end() ? nullptr : &*it;
}

bool BatchClasses::CanStartAt(size_t at) const {
  if (at == 0 || at >= n_) return false;
  const Run* r = RunAt(at);
  return at == r->begin || r->end - at >= MinBatchOf(*r);
}

size_t BatchClasses::LastStartAtOrBelow(size_t limit) const {
  if (n_ == 0) return 0;
  limit = std::min(limit, n_ - 1);
  for (auto it = runs_.rbegin(); it != runs_.rend(); ++it) {
    if (it->begin > limit) continue;
    const size_t m = MinBatchOf(*it);
    if (it->end >= m && it->end - m >= it->begin) {
      const size_t inside = std::min(limit, it->end - m);
      if (inside > 0 && inside >= it->begin) return inside;
    }
    return it->begin;  // 0 for the first run: no start point at or below limit
  }
  return 0;
}

BatchClasses::Cuts BatchClasses::Cut(size_t from, std::span<const size_t> stops, size_t max_long) const {
  Cuts out;
  if (from >= n_) return out;
  std::vector<size_t> wanted(stops.begin(), stops.end());
  std::sort(wanted.begin(), wanted.end());
  std::vector<std::pair<size_t, bool>> cuts;  // (end, short run)
  size_t last = from;
  auto stop = wanted.begin();
  for (const Run& r : runs_) {
    if (r.end <= from) continue;
    const size_t m = MinBatchOf(r);
    for (; stop != wanted.end() && *stop < r.end; ++stop) {
      if (*stop <= last) continue;
      if (*stop - last >= m && r.end - *stop >= m) {
        cuts.push_back({*stop, r.short_rows});
        out.stops.push_back(*stop);
        last = *stop;
      }
    }
    if (stop != wanted.end() && *stop == r.end && r.end < n_) {
      out.stops.push_back(r.end);
      ++stop;
    }
    cuts.push_back({r.end, r.short_rows});
    last = r.end;
  }
  size_t at = from;
  for (const auto& [end, is_short] : cuts) {
    const size_t len = end - at;
    const size_t most = is_short ? std::max<size_t>(1, min_long_ - 1) : std::max<size_t>(1, max_long);
    const size_t pieces = (len + most - 1) / most;
    for (size_t k = 1; k < pieces; ++k) out.batch_ends.push_back(at + len * k / pieces);
    out.batch_ends.push_back(end);
    at = end;
  }
  return out;
}

std::string BatchClasses::Fingerprint() const {
  std::string out;
  for (const Run& r : runs_) {
    if (r.short_rows) out += StrCat(out.empty() ? "" : ",", r.begin, "-", r.end);
  }
  return out;
}

}  // namespace skippy::cache
