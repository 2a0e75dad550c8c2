// Fuzz target: a chat request body through everything that turns messages into prompt tokens:
// the request parser, the chat template (the GGUF's, run by llama.cpp's Jinja engine, compiled
// into the target with the same instrumentation), tokenization, the message boundary search and
// /apply-template, and with tools the calls' grammar and the reply parser (run on the last
// message's text). None may crash; what PreparePrompt accepts must be a non-empty prompt of valid
// tokens with boundaries ascending inside it.
//
// Needs a model: SKIPPY_FUZZ_MODEL, else the tiny zoo's llama (the test suite generates it; its
// template writes no calls, so tools reach the grammar and the parser only with a model whose
// template does, as tests/support/chat_template_gguf.h writes one).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "nlohmann/json.hpp"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/model.h"
#include "skippy/server/request.h"

namespace {

const skippy::runtime::Model& TheModel() {
  static const std::unique_ptr<skippy::runtime::Model> model = [] {
    const char* env = std::getenv("SKIPPY_FUZZ_MODEL");
    const std::string path = env != nullptr ? env : SKIPPY_FUZZ_DEFAULT_MODEL;
    skippy::runtime::EnsureLlamaBackend();
    auto m = skippy::runtime::Model::Load(path);
    if (!m.ok()) {
      std::fprintf(stderr, "chat fuzz: cannot load %s: %s\n", path.c_str(), std::string(m.status().message()).c_str());
      std::abort();
    }
    return std::move(*m);
  }();
  return *model;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using skippy::server::Endpoint;
  const skippy::runtime::Model& model = TheModel();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const skippy::server::RequestLimits limits;
  if (!skippy::server::CheckJsonShape(body, limits).ok()) return 0;
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto r = skippy::server::ParseGenerationRequest(Endpoint::kChatCompletions, j, limits);
  if (r.ok()) {
    auto p = skippy::server::PreparePrompt(model, *r);
    if (p.ok()) {
      if (p->tokens.empty() || !model.ValidateTokens(p->tokens).ok()) std::abort();
      size_t prev = 0;
      for (size_t b : p->message_boundaries) {
        if (b <= prev || b >= p->tokens.size()) std::abort();
        prev = b;
      }
      // With tools: the reply parser on text from the request (the last message's), whole and
      // as every prefix a stream would parse, and the deltas between those parses.
      if (p->reply_parser != nullptr && !r->messages.empty()) {
        const std::string& text = r->messages.back().content;
        (void)p->reply_parser->Parse(text, /*partial=*/false);
        skippy::runtime::ParsedReply sent;
        std::vector<bool> named;
        for (size_t n = 0; n <= text.size(); n += 1 + text.size() / 16) {
          auto part = p->reply_parser->Parse(text.substr(0, n), /*partial=*/true);
          if (!part.ok()) continue;
          if (skippy::runtime::StreamDeltas(sent, *part, /*partial=*/true, named).ok()) sent = *std::move(part);
        }
      }
    }
  }
  if (j.is_object() && j.contains("messages")) {
    (void)skippy::server::ApplyTemplate(model, nlohmann::json{{"messages", j["messages"]}}, limits);
  }
  return 0;
}
