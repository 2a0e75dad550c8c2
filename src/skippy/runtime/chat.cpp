#include "skippy/runtime/chat.h"

#include <dlfcn.h>

#include <cstdio>

#include <exception>

#include "common/chat.h"  // types only: the functions come from LoadJinja
#include "llama.h"
#include "skippy/common/strings.h"

namespace skippy::runtime {

namespace {

// common_chat_templates_init returns a std::unique_ptr whose deleter calls into the library; this
// holder is returned the same way (one pointer, non-trivially destructible, so through memory) and
// never frees, so nothing here needs the library's symbols at link time.
struct TemplatesOut {
  common_chat_templates* p = nullptr;
  ~TemplatesOut() {}
};
static_assert(sizeof(TemplatesOut) == sizeof(common_chat_templates_ptr));

// llama.cpp's common library (the Jinja engine llama-server renders chat templates with), loaded
// on first use instead of linked: it carries its own build of cpp-httplib, whose exported symbols
// would clash with the one skippy links (built with other options; linked against Debian's older
// cpp-httplib, the process corrupted its heap at startup). RTLD_LOCAL keeps its symbols out of the process's scope and RTLD_DEEPBIND makes its
// own references bind to its own definitions first. The symbol names are those of the pinned
// llama.cpp; when any is missing the library is not used.
struct JinjaLib {
  TemplatesOut (*init)(const llama_model*, const std::string&, const std::string&, const std::string&) = nullptr;
  decltype(&common_chat_templates_apply) apply = nullptr;
  decltype(&common_chat_templates_free) free = nullptr;
  decltype(&common_chat_templates_support_enable_thinking) thinking = nullptr;
};

// AddressSanitizer refuses RTLD_DEEPBIND (google/sanitizers#611), and without it the library's
// cpp-httplib would bind to the process's: a sanitizer build renders with the GGUF's built-in
// template (or ChatML) instead, the same on every path of that build.
#if defined(__SANITIZE_ADDRESS__)
#define SKIPPY_NO_DEEPBIND 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SKIPPY_NO_DEEPBIND 1
#endif
#endif

const JinjaLib* LoadJinja() {
  static const JinjaLib lib = [] {
    JinjaLib l;
#ifdef SKIPPY_NO_DEEPBIND
    std::fprintf(stderr, "skippy: sanitizer build: chat templates without llama.cpp's Jinja engine\n");
    return l;
#endif
    void* h = dlopen(SKIPPY_LLAMA_COMMON_LIB, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr) return l;
    auto sym = [&](const char* name) { return dlsym(h, name); };
    l.init = reinterpret_cast<decltype(l.init)>(
        sym("_Z26common_chat_templates_initPK11llama_modelRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES9_S9_"));
    l.apply = reinterpret_cast<decltype(l.apply)>(
        sym("_Z27common_chat_templates_applyPK21common_chat_templatesRK28common_chat_templates_inputs"));
    l.free = reinterpret_cast<decltype(l.free)>(sym("_Z26common_chat_templates_freeP21common_chat_templates"));
    l.thinking = reinterpret_cast<decltype(l.thinking)>(
        sym("_Z45common_chat_templates_support_enable_thinkingPK21common_chat_templates"));
    if (!l.init || !l.apply || !l.free || !l.thinking) l = JinjaLib{};
    return l;
  }();
  return lib.init ? &lib : nullptr;
}

// llama-server's rendering of a chat request (no tools; thinking on when the template supports
// it, as llama-server's default); nullopt when the template throws (some refuse a prefix of a
// conversation).
std::optional<std::string> RenderJinja(const common_chat_templates* t, const std::vector<ChatMessage>& messages,
                                       size_t count, bool add_assistant) {
  const JinjaLib* lib = LoadJinja();
  if (lib == nullptr || t == nullptr) return std::nullopt;
  common_chat_templates_inputs in;
  for (size_t i = 0; i < count; ++i) {
    common_chat_msg m;
    m.role = messages[i].role;
    m.content = messages[i].content;
    in.messages.push_back(std::move(m));
  }
  in.use_jinja = true;
  in.add_generation_prompt = add_assistant;
  in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
  try {
    in.enable_thinking = lib->thinking(t);
    return lib->apply(t, in).prompt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

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

const common_chat_templates* Model::ChatTemplates() const {
  std::call_once(chat_once_, [this] {
    const JinjaLib* lib = LoadJinja();
    if (lib == nullptr) return;
    try {
      TemplatesOut out = lib->init(model_, "", "", "");
      if (out.p != nullptr) chat_templates_ = std::shared_ptr<common_chat_templates>(out.p, lib->free);
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
  const char* tmpl = llama_model_chat_template(model.raw(), nullptr);
  const common_chat_templates* jinja = model.ChatTemplates();
  enum class How { kJinja, kBuiltIn, kChatMl } how = How::kChatMl;
  RenderedChat out;
  std::optional<std::string> whole = RenderJinja(jinja, messages, messages.size(), add_assistant_prompt);
  if (whole) {
    how = How::kJinja;
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

}  // namespace skippy::runtime
