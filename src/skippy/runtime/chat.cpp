#include "skippy/runtime/chat.h"

#include "llama.h"
#include "skippy/common/strings.h"

namespace skippy::runtime {

namespace {

std::string RenderChatMl(const std::vector<ChatMessage>& messages, size_t count, bool add_assistant) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    StrAppend(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content, "<|im_end|>\n");
  }
  if (add_assistant) out += "<|im_start|>assistant\n";
  return out;
}

// llama.cpp's renderer; nullopt when it does not recognise the template.
std::optional<std::string> RenderWith(const char* tmpl, const std::vector<ChatMessage>& messages, size_t count,
                                      bool add_assistant) {
  std::vector<llama_chat_message> chat;
  size_t chars = 0;
  for (size_t i = 0; i < count; ++i) {
    chat.push_back({messages[i].role.c_str(), messages[i].content.c_str()});
    chars += messages[i].role.size() + messages[i].content.size();
  }
  std::string buf(2 * chars + 256, '\0');
  int32_t n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(),
                                        static_cast<int32_t>(buf.size()));
  if (n < 0) return std::nullopt;
  if (static_cast<size_t>(n) > buf.size()) {
    buf.resize(static_cast<size_t>(n));
    n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(),
                                  static_cast<int32_t>(buf.size()));
    if (n < 0) return std::nullopt;
  }
  buf.resize(static_cast<size_t>(n));
  return buf;
}

}  // namespace

StatusOr<RenderedChat> RenderChat(const Model& model, const std::vector<ChatMessage>& messages,
                                  bool add_assistant_prompt) {
  if (messages.empty()) return absl::InvalidArgumentError("messages must not be empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) return absl::InvalidArgumentError(StrCat("messages[", i, "].role is empty"));
  }
  const char* tmpl = llama_model_chat_template(model.raw(), nullptr);
  RenderedChat out;
  std::optional<std::string> whole;
  if (tmpl != nullptr) whole = RenderWith(tmpl, messages, messages.size(), add_assistant_prompt);
  const bool fallback = !whole.has_value();
  if (fallback) {
    out.text = RenderChatMl(messages, messages.size(), add_assistant_prompt);
    out.template_name = "chatml-fallback";
  } else {
    out.text = std::move(*whole);
    out.template_name = "gguf";
  }
  // Message boundaries: the rendering of the first i+1 messages, if it is a prefix of the whole.
  for (size_t i = 0; i + 1 < messages.size(); ++i) {
    std::optional<std::string> part =
        fallback ? std::optional(RenderChatMl(messages, i + 1, false)) : RenderWith(tmpl, messages, i + 1, false);
    if (!part || part->empty() || part->size() >= out.text.size() || out.text.compare(0, part->size(), *part) != 0) {
      out.message_ends.clear();
      return out;
    }
    if (out.message_ends.empty() || out.message_ends.back() < part->size()) out.message_ends.push_back(part->size());
  }
  return out;
}

}  // namespace skippy::runtime
