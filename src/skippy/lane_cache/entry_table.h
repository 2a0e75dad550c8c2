// EntryTable: what the lane cache knows about each entry beyond the cache core's EntryDesc: its
// namespace, the tier payload holding its bytes, where a hybrid's recurrent part starts in them,
// and the batch classes its rows were computed in; and which entry owns which payload.
//
// Every committed entry is in the table until the lane cache frees it (the cache core returned it
// as evicted, erased or released after an erase). A payload the tier evicted is marked gone here
// (PayloadGone) so it is not given back twice.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "skippy/cache/batch_classes.h"
#include "skippy/cache/payload_tier.h"
#include "skippy/cache/radix_index.h"

namespace skippy::lane_cache {

class EntryTable {
 public:
  struct Entry {
    std::string cache_namespace;      // the scope's (tenant namespace plus clear epochs)
    cache::PayloadId payload_id = 0;  // 0 once the tier evicted it
    size_t recurrent_offset = 0;      // hybrid KvRecurrent: where the recurrent block starts; 0: unknown
    cache::BatchClasses classes;      // of the entry's rows
  };

  void Add(cache::EntryId id, Entry entry);
  const Entry* Find(cache::EntryId id) const;
  // Removes the entry; returns the payload it still owns (0 when none).
  cache::PayloadId Forget(cache::EntryId id);
  // The tier evicted `payload`: returns its owner, which no longer owns it (nullopt: no owner).
  std::optional<cache::EntryId> PayloadGone(cache::PayloadId payload);
  // The entries of one namespace (every entry when nullopt).
  std::vector<cache::EntryId> InNamespace(const std::optional<std::string>& cache_namespace) const;
  size_t size() const { return entries_.size(); }

 private:
  std::map<cache::EntryId, Entry> entries_;
  std::map<cache::PayloadId, cache::EntryId> owner_;
};

}  // namespace skippy::lane_cache
