#include "skippy/server/tenant_usage.h"

namespace skippy::server {

TenantUsage::TenantUsage(const std::vector<std::string>& namespaces) {
  for (const std::string& ns : namespaces) {
    if (!ns.empty()) usage_[ns];
  }
}

void TenantUsage::Count(const std::string& key_namespace, const Job::View& done) {
  std::lock_guard lock(mu_);
  auto it = usage_.find(key_namespace);
  if (it == usage_.end()) return;
  Usage& u = it->second;
  ++u.requests;
  if (done.error) {
    ++(done.error->code == "cancelled" ? u.cancelled : u.errors);
    return;
  }
  const JobTimings& t = done.timings;
  u.prompt_tokens += t.cache_n + t.prompt_n;
  u.cached_tokens += t.cache_n;
  u.generated_tokens += done.tokens.size();
  if (t.decoded_result_hit) ++u.hits["decoded"];
  if (!t.cache_tier.empty()) ++u.hits[t.cache_tier];
}

nlohmann::json TenantUsage::Json(const Usage& u) {
  nlohmann::json hits = {{"lane", 0}, {"memory", 0}, {"disk", 0}, {"shared", 0}, {"decoded", 0}};
  for (const auto& [tier, n] : u.hits) hits[tier] = n;
  return {{"requests", u.requests},         {"errors", u.errors},
          {"cancelled", u.cancelled},       {"prompt_tokens", u.prompt_tokens},
          {"cached_tokens", u.cached_tokens}, {"generated_tokens", u.generated_tokens},
          {"hits", hits}};
}

nlohmann::json TenantUsage::View(const std::string& key_namespace) const {
  std::lock_guard lock(mu_);
  auto it = usage_.find(key_namespace);
  return it == usage_.end() ? nlohmann::json() : Json(it->second);
}

nlohmann::json TenantUsage::All() const {
  std::lock_guard lock(mu_);
  nlohmann::json all = nlohmann::json::object();
  for (const auto& [ns, u] : usage_) all[ns] = Json(u);
  return all;
}

}  // namespace skippy::server
