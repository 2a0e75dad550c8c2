// TenantUsage: what each API key's namespace has asked of the server, for that tenant's own view
// of GET /cache/stats (a key with a namespace sees its own usage and nothing of other tenants or
// of the cache as a whole) and for the operator's view (every namespace's usage side by side).
//
// Counted per key namespace (the namespace an --api-key names, whatever cache_salt a request adds),
// and only for the namespaces configured at startup, so no request can make the table grow.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/server/job.h"

namespace skippy::server {

class TenantUsage {
 public:
  explicit TenantUsage(const std::vector<std::string>& namespaces);

  // A finished job of `key_namespace` (ignored when it is not a configured namespace).
  void Count(const std::string& key_namespace, const Job::View& done);
  // {requests, errors, cancelled, prompt_tokens, cached_tokens, generated_tokens, hits: {lane,
  // memory, disk, shared, decoded}}; null for a namespace that is not configured.
  nlohmann::json View(const std::string& key_namespace) const;
  // Every configured namespace's View, keyed by namespace.
  nlohmann::json All() const;

 private:
  struct Usage {
    uint64_t requests = 0, errors = 0, cancelled = 0;
    uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    std::map<std::string, uint64_t> hits;  // by tier, and "decoded"
  };
  static nlohmann::json Json(const Usage& u);

  mutable std::mutex mu_;
  std::map<std::string, Usage> usage_;  // keys fixed at construction
};

}  // namespace skippy::server
