#include "skippy/runtime/chat.h"

#include <algorithm>
#include <exception>

#include "common/chat.h"  // llama.cpp's Jinja engine (cmake/llama_common.cmake)
#include "llama.h"
#include "skippy/common/strings.h"

namespace skippy::runtime {

namespace {

// A conversation that ends in an assistant message, rendered for generation: llama-server
// continues that message (its prefill_assistant default) rather than opening another.
bool ContinuesFinal(const std::vector<ChatMessage>& messages, size_t count, bool add_assistant) {
  return add_assistant && count > 0 && messages[count - 1].role == "assistant";
}

// llama-server's rendering of a chat request (no tools; thinking on when the template supports
// it, as llama-server's default; a final assistant message continued); nullopt when the template
// throws (some refuse a prefix of a conversation), with what it said in *error.
std::optional<std::string> RenderJinja(const common_chat_templates* t, const std::vector<ChatMessage>& messages,
                                       size_t count, bool add_assistant, std::string* error = nullptr) {
  if (t == nullptr) return std::nullopt;
  common_chat_templates_inputs in;
  for (size_t i = 0; i < count; ++i) {
    common_chat_msg m;
    m.role = messages[i].role;
    if (messages[i].text_parts.empty()) {
      m.content = messages[i].content;
    } else {
      for (const std::string& text : messages[i].text_parts) m.content_parts.push_back({"text", text});
    }
    in.messages.push_back(std::move(m));
  }
  in.use_jinja = true;
  in.add_generation_prompt = add_assistant;
  if (ContinuesFinal(messages, count, add_assistant)) {
    in.add_generation_prompt = false;
    in.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
  }
  in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
  try {
    in.enable_thinking = common_chat_templates_support_enable_thinking(t);
    return common_chat_templates_apply(t, in).prompt;
  } catch (const std::exception& e) {
    if (error != nullptr) *error = e.what();
    return std::nullopt;
  }
}

std::string RenderChatMl(const std::vector<ChatMessage>& messages, size_t count, bool add_assistant) {
  if (ContinuesFinal(messages, count, add_assistant)) {
    return RenderChatMl(messages, count - 1, true) + messages[count - 1].content;
  }
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
  if (ContinuesFinal(messages, count, add_assistant)) {
    std::optional<std::string> head = RenderWith(tmpl, messages, count - 1, true);
    if (head) *head += messages[count - 1].content;
    return head;
  }
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

const common_chat_templates* Model::ChatTemplates() const {
  std::call_once(chat_once_, [this] {
    try {
      common_chat_templates_ptr templates = common_chat_templates_init(model_, "", "", "");
      if (templates != nullptr) chat_templates_ = std::shared_ptr<common_chat_templates>(std::move(templates));
    } catch (const std::exception&) {
    }
  });
  return chat_templates_.get();
}

StatusOr<RenderedChat> RenderChat(const Model& model, const std::vector<ChatMessage>& messages,
                                  bool add_assistant_prompt, size_t ends) {
  if (messages.empty()) return absl::InvalidArgumentError("messages must not be empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) return absl::InvalidArgumentError(StrCat("messages[", i, "].role is empty"));
  }
  if (add_assistant_prompt && messages.size() >= 2 && messages.back().role == "assistant" &&
      messages[messages.size() - 2].role == "assistant") {
    // The final one is continued: which of two would be is not said (llama-server's answer too).
    return absl::InvalidArgumentError("the conversation ends in two assistant messages; only the last can be continued");
  }
  const char* tmpl = llama_model_chat_template(model.raw(), nullptr);
  const common_chat_templates* jinja = model.ChatTemplates();
  enum class How { kJinja, kBuiltIn, kChatMl } how = How::kChatMl;
  RenderedChat out;
  std::string refused;
  std::optional<std::string> whole = RenderJinja(jinja, messages, messages.size(), add_assistant_prompt, &refused);
  if (whole) {
    how = How::kJinja;
  } else if (jinja != nullptr) {
    // The model's own template refuses these messages (roles that do not alternate, a role it does
    // not know): llama-server answers an error, and another template would render a prompt the
    // model was not trained on.
    return absl::InvalidArgumentError(StrCat("the model's chat template refused the messages: ", refused));
  } else if (tmpl != nullptr && (whole = RenderWith(tmpl, messages, messages.size(), add_assistant_prompt))) {
    how = How::kBuiltIn;
  }
  switch (how) {
    case How::kJinja: out.template_name = "jinja"; break;
    case How::kBuiltIn: out.template_name = "gguf"; break;
    case How::kChatMl: out.template_name = "chatml-fallback"; break;
  }
  out.text = whole ? std::move(*whole) : RenderChatMl(messages, messages.size(), add_assistant_prompt);
  // Message boundaries: the rendering of the first i+1 messages, if it is a prefix of the whole.
  const size_t first = messages.size() - 1 > ends ? messages.size() - 1 - ends : 0;
  for (size_t i = first; i + 1 < messages.size(); ++i) {
    std::optional<std::string> part = how == How::kJinja     ? RenderJinja(jinja, messages, i + 1, false)
                                      : how == How::kBuiltIn ? RenderWith(tmpl, messages, i + 1, false)
                                                             : std::optional(RenderChatMl(messages, i + 1, false));
    if (!part || part->empty() || part->size() >= out.text.size() || out.text.compare(0, part->size(), *part) != 0) {
      out.message_ends.clear();
      return out;
    }
    if (out.message_ends.empty() || out.message_ends.back() < part->size()) out.message_ends.push_back(part->size());
  }
  return out;
}

namespace {

// The tokens every one of `texts` starts with, each tokenized as a prompt.
StatusOr<std::vector<Token>> SharedTokens(const Model& model, const std::vector<std::string>& texts) {
  std::vector<Token> shared;
  for (size_t i = 0; i < texts.size(); ++i) {
    SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> t, model.Tokenize(texts[i], true, true));
    if (i == 0) {
      shared = std::move(t);
    } else {
      shared.erase(std::mismatch(shared.begin(), shared.end(), t.begin(), t.end()).first, shared.end());
    }
  }
  return shared;
}

}  // namespace

StatusOr<std::vector<Token>> NextTurnPrefix(const Model& model, std::vector<ChatMessage> messages,
                                            std::string reply) {
  if (!messages.empty() && messages.back().role == "assistant") {
    // A continued message: the client sends it back whole, the reply after what it began with.
    messages.back().content += reply;
    messages.back().text_parts.clear();
  } else {
    messages.push_back({"assistant", std::move(reply)});
  }
  // Two contents that part at their first character, and neither a space nor a newline, which
  // some tokenizers join to the template's text before them.
  std::vector<std::string> texts;
  for (const char* probe : {"x", "0"}) {
    messages.push_back({"user", probe});
    SKIPPY_ASSIGN_OR_RETURN(RenderedChat chat, RenderChat(model, messages, /*add_assistant_prompt=*/false, 0));
    texts.push_back(std::move(chat.text));
    messages.pop_back();
  }
  return SharedTokens(model, texts);
}

StatusOr<std::vector<Token>> NextTextPrefix(const Model& model, const std::string& text) {
  return SharedTokens(model, {text + "\n", text + " ", text + "x"});
}

}  // namespace skippy::runtime
