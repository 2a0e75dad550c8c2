#include "skippy/lane_cache/entry_table.h"

#include <utility>

namespace skippy::lane_cache {

void EntryTable::Add(cache::EntryId id, Entry entry) {
  if (entry.payload_id != 0) owner_[entry.payload_id] = id;
  entries_[id] = std::move(entry);
}

const EntryTable::Entry* EntryTable::Find(cache::EntryId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

cache::PayloadId EntryTable::Forget(cache::EntryId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return 0;
  const cache::PayloadId payload = it->second.payload_id;
  if (payload != 0) owner_.erase(payload);
  entries_.erase(it);
  return payload;
}

std::optional<cache::EntryId> EntryTable::PayloadGone(cache::PayloadId payload) {
  auto it = owner_.find(payload);
  if (it == owner_.end()) return std::nullopt;
  const cache::EntryId id = it->second;
  owner_.erase(it);
  if (auto e = entries_.find(id); e != entries_.end()) e->second.payload_id = 0;
  return id;
}

std::vector<cache::EntryId> EntryTable::InNamespace(const std::optional<std::string>& ns) const {
  std::vector<cache::EntryId> out;
  for (const auto& [id, e] : entries_) {
    if (!ns || e.cache_namespace == *ns) out.push_back(id);
  }
  return out;
}

}  // namespace skippy::lane_cache
