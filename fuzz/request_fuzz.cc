// Fuzz target: a request body as skippy-server receives it, through every check that runs before
// the engine sees it: the JSON shape limit, the parser, each endpoint's request parser and the
// budget check. None may crash, hang or let an invalid request through (ParseGenerationRequest's
// result is re-checked against the sampler's own limits).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "nlohmann/json.hpp"
#include "skippy/runtime/sampler.h"
#include "skippy/server/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using skippy::server::Endpoint;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const skippy::server::RequestLimits limits;
  if (!skippy::server::CheckJsonShape(body, limits).ok()) return 0;
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  for (Endpoint e : {Endpoint::kLlamaCompletion, Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    auto r = skippy::server::ParseGenerationRequest(e, j, limits);
    if (!r.ok()) continue;
    // What the parser accepts, the engine must accept too.
    if (!skippy::runtime::Sampler::Validate(r->sampling).ok()) std::abort();
    if (r->messages.size() > limits.max_messages) std::abort();
    const size_t n = r->prompt_tokens ? r->prompt_tokens->size() : 1;
    for (int64_t default_max : {int64_t{-1}, int64_t{256}}) {  // -n -1 (the default) and -n 256
      auto budget = skippy::server::CheckBudget({512, 0, 0, default_max}, n, r->max_tokens);
      if (budget.ok() && (*budget < 0 || static_cast<int64_t>(n) + *budget > 512)) std::abort();
    }
  }
  return 0;
}
