#include "skippy/runtime/chat.h"

#include <algorithm>
#include <cctype>
#include <exception>

#include "common/chat.h"  // llama.cpp's Jinja engine (cmake/llama_common.cmake)
#include "llama.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/sampler.h"

namespace skippy::runtime {

namespace {

// A conversation that ends in an assistant message, rendered for generation: llama-server
// continues that message (its prefill_assistant default) rather than opening another.
bool ContinuesFinal(const std::vector<ChatMessage>& messages, size_t count, bool add_assistant) {
  return add_assistant && count > 0 && messages[count - 1].role == "assistant";
}

// llama-server's rendering of a chat request (thinking on when the template supports it, as
// llama-server's default; a final assistant message continued; the tools, if any); nullopt when
// the template throws (some refuse a prefix of a conversation), with what it said in *error.
std::optional<common_chat_params> ApplyJinja(const common_chat_templates* t, const std::vector<ChatMessage>& messages,
                                             size_t count, bool add_assistant, const ChatTools* tools,
                                             std::string* error = nullptr) {
  if (t == nullptr) return std::nullopt;
  common_chat_templates_inputs in;
  for (size_t i = 0; i < count; ++i) {
    const ChatMessage& msg = messages[i];
    common_chat_msg m;
    m.role = msg.role;
    if (msg.text_parts.empty()) {
      m.content = msg.content;
    } else {
      for (const std::string& text : msg.text_parts) m.content_parts.push_back({"text", text});
    }
    for (const ToolCall& c : msg.tool_calls) m.tool_calls.push_back({c.name, c.arguments, c.id});
    m.tool_call_id = msg.tool_call_id;
    m.tool_name = msg.name;
    m.reasoning_content = msg.reasoning_content;
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
    if (tools != nullptr && !tools->tools.empty()) {
      for (const ChatTool& tool : tools->tools) in.tools.push_back({tool.name, tool.description, tool.parameters});
      in.tool_choice = tools->choice == ToolChoice::kRequired ? COMMON_CHAT_TOOL_CHOICE_REQUIRED
                       : tools->choice == ToolChoice::kNone   ? COMMON_CHAT_TOOL_CHOICE_NONE
                                                              : COMMON_CHAT_TOOL_CHOICE_AUTO;
      in.parallel_tool_calls = tools->parallel_calls.value_or(common_chat_templates_get_caps(t)["supports_parallel_tool_calls"]);
    }
    in.enable_thinking = common_chat_templates_support_enable_thinking(t);
    return common_chat_templates_apply(t, in);
  } catch (const std::exception& e) {
    if (error != nullptr) *error = e.what();
    return std::nullopt;
  }
}

std::optional<std::string> RenderJinja(const common_chat_templates* t, const std::vector<ChatMessage>& messages,
                                       size_t count, bool add_assistant, const ChatTools* tools) {
  std::optional<common_chat_params> p = ApplyJinja(t, messages, count, add_assistant, tools);
  if (!p) return std::nullopt;
  return std::move(p->prompt);
}

// What llama-server's sampler and parser take from a chat's parameters (server-schema's
// preserved_tokens and grammar_triggers, common_sampler_init's trigger patterns and prefill).
StatusOr<ToolCalling> ToolCallingOf(const Model& model, const common_chat_params& p, const ChatTools& tools) {
  ToolCalling out;
  out.grammar = p.grammar;
  out.grammar_lazy = p.grammar_lazy;
  out.stops = p.additional_stops;
  out.generation_prompt = p.generation_prompt;
  out.parser = p.parser;
  out.format = static_cast<int>(p.format);
  out.parse_tool_calls = tools.choice != ToolChoice::kNone;
  // One token each, as llama-server keeps them (a longer spelling is plain text anyway).
  auto single_token = [&](const std::string& text) -> StatusOr<std::optional<Token>> {
    SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> ids, model.Tokenize(text, /*add_special=*/false, /*parse_special=*/true));
    return ids.size() == 1 ? std::optional<Token>(ids[0]) : std::nullopt;
  };
  for (const std::string& t : p.preserved_tokens) {
    SKIPPY_ASSIGN_OR_RETURN(std::optional<Token> id, single_token(t));
    if (id) out.preserved_tokens.push_back(*id);
  }
  for (const common_grammar_trigger& t : p.grammar_triggers) {
    switch (t.type) {
      case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: {
        SKIPPY_ASSIGN_OR_RETURN(std::optional<Token> id, single_token(t.value));
        if (id && std::find(out.preserved_tokens.begin(), out.preserved_tokens.end(), *id) != out.preserved_tokens.end()) {
          out.trigger_tokens.push_back(*id);
        } else {
          out.trigger_patterns.push_back(regex_escape(t.value));
        }
        break;
      }
      case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: out.trigger_patterns.push_back(t.value); break;
      case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
        std::string anchored = "^$";
        if (!t.value.empty()) {
          anchored = (t.value.front() != '^' ? "^" : "") + t.value + (t.value.back() != '$' ? "$" : "");
        }
        out.trigger_patterns.push_back(std::move(anchored));
        break;
      }
      case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: out.trigger_tokens.push_back(t.token); break;
    }
  }
  if (!out.grammar.empty() && out.grammar_lazy && out.trigger_patterns.empty() && out.trigger_tokens.empty()) {
    return absl::InvalidArgumentError("the chat template's tool grammar is lazy but has no triggers");
  }
  if (!p.generation_prompt.empty()) {
    // The tokens of the generation prompt the template already wrote (a space a tokenizer puts
    // before the first special token is not among them): a grammar that is not lazy spells it and
    // reads them first; a reasoning block may open in it.
    SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> ids,
                            model.Tokenize(p.generation_prompt, /*add_special=*/false, /*parse_special=*/true));
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i == 0 && !std::isspace(static_cast<unsigned char>(p.generation_prompt[0]))) {
        StatusOr<std::string> piece = TokenPiece(model, ids[i], /*special=*/true);
        if (piece.ok() && !piece->empty() && std::isspace(static_cast<unsigned char>((*piece)[0]))) continue;
      }
      out.generation_prompt_tokens.push_back(ids[i]);
    }
  }
  if (!out.grammar.empty() && !out.grammar_lazy) out.grammar_prefill = out.generation_prompt_tokens;
  if (!p.thinking_end_tags.empty() && !p.thinking_start_tag.empty()) {
    SKIPPY_ASSIGN_OR_RETURN(out.reasoning_start,
                            model.Tokenize(p.thinking_start_tag, /*add_special=*/false, /*parse_special=*/true));
    for (const std::string& tag : p.thinking_end_tags) {
      if (tag.empty()) continue;
      SKIPPY_ASSIGN_OR_RETURN(std::vector<Token> end, model.Tokenize(tag, /*add_special=*/false, /*parse_special=*/true));
      out.reasoning_end.push_back(std::move(end));
    }
  }
  return out;
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
                                  bool add_assistant_prompt, size_t ends, const ChatTools* tools) {
  if (messages.empty()) return absl::InvalidArgumentError("messages must not be empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) return absl::InvalidArgumentError(StrCat("messages[", i, "].role is empty"));
  }
  if (add_assistant_prompt && messages.size() >= 2 && messages.back().role == "assistant" &&
      messages[messages.size() - 2].role == "assistant") {
    // The final one is continued: which of two would be is not said (llama-server's answer too).
    return absl::InvalidArgumentError("the conversation ends in two assistant messages; only the last can be continued");
  }
  if (add_assistant_prompt && messages.back().role == "assistant" && !messages.back().tool_calls.empty()) {
    return absl::InvalidArgumentError("the final assistant message has tool calls: it cannot be continued");
  }
  if (tools != nullptr && tools->tools.empty()) tools = nullptr;
  const char* tmpl = llama_model_chat_template(model.raw(), nullptr);
  const common_chat_templates* jinja = model.ChatTemplates();
  if (tools != nullptr && jinja == nullptr) {
    return absl::InvalidArgumentError("tools need the model's chat template, which llama.cpp could not load");
  }
  if (tools != nullptr && tools->active() && !common_chat_templates_get_caps(jinja)["supports_tool_calls"]) {
    // llama.cpp would render the prompt without them and never parse a call: a client that asked
    // for a call would get text it cannot tell from an answer.
    return absl::InvalidArgumentError("the model's chat template does not write tool calls, so this model cannot call tools");
  }
  enum class How { kJinja, kBuiltIn, kChatMl } how = How::kChatMl;
  RenderedChat out;
  std::string refused;
  std::optional<std::string> whole;
  if (std::optional<common_chat_params> p =
          ApplyJinja(jinja, messages, messages.size(), add_assistant_prompt, tools, &refused)) {
    how = How::kJinja;
    whole = std::move(p->prompt);
    if (tools != nullptr) {
      SKIPPY_ASSIGN_OR_RETURN(out.tool_calling, ToolCallingOf(model, *p, *tools));
      out.tool_calling->continues = ContinuesFinal(messages, messages.size(), add_assistant_prompt);
    }
  } else if (jinja != nullptr) {
    // The model's own template refuses these messages (roles that do not alternate, a role it does
    // not know), or llama.cpp finds no call syntax in it for the tools: llama-server answers an
    // error, and another template would render a prompt the model was not trained on.
    return absl::InvalidArgumentError(StrCat("the model's chat template refused the messages",
                                             tools != nullptr ? " or the tools" : "", ": ", refused));
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
    std::optional<std::string> part = how == How::kJinja     ? RenderJinja(jinja, messages, i + 1, false, tools)
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

void ConstrainToCalls(const ToolCalling& calling, SamplingParams& params) {
  if (calling.grammar.empty()) return;
  params.grammar = calling.grammar;
  params.grammar_lazy = calling.grammar_lazy;
  params.grammar_trigger_patterns = calling.trigger_patterns;
  params.grammar_trigger_tokens = calling.trigger_tokens;
  params.grammar_prefill = calling.grammar_prefill;
  params.reasoning_start = calling.reasoning_start;
  params.reasoning_end = calling.reasoning_end;
  params.reasoning_prefill = calling.generation_prompt_tokens;
}

struct ReplyParser::Impl {
  common_chat_parser_params params;
  common_chat_msg baseline;  // a continued message: what the parse of no text reads (the prefill)
};

ReplyParser::ReplyParser(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ReplyParser::~ReplyParser() = default;

StatusOr<std::shared_ptr<const ReplyParser>> ReplyParser::Create(const ToolCalling& calling) {
  auto impl = std::make_unique<Impl>();
  common_chat_parser_params& p = impl->params;
  p.format = static_cast<common_chat_format>(calling.format);
  p.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;  // as rendered (and llama-server's default)
  p.generation_prompt = calling.generation_prompt;
  p.parse_tool_calls = calling.parse_tool_calls;
  p.is_continuation = calling.continues;
  try {
    if (!calling.parser.empty()) p.parser.load(calling.parser);
    // As llama-server's stream starts from it, so that the prefill is not sent as a delta.
    if (calling.continues) impl->baseline = common_chat_parse("", /*is_partial=*/true, p);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(StrCat("the chat template's reply parser does not load: ", e.what()));
  }
  return std::shared_ptr<const ReplyParser>(new ReplyParser(std::move(impl)));
}

StatusOr<ParsedReply> ReplyParser::Parse(const std::string& text, bool partial) const {
  common_chat_msg msg;
  try {
    msg = common_chat_parse(text, partial, impl_->params);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  // A continued message: the text it began with is the client's, not the reply's.
  auto drop_prefill = [](std::string& s, const std::string& prefill) {
    if (!prefill.empty() && s.compare(0, prefill.size(), prefill) == 0) s.erase(0, prefill.size());
  };
  drop_prefill(msg.content, impl_->baseline.content);
  drop_prefill(msg.reasoning_content, impl_->baseline.reasoning_content);
  ParsedReply out;
  out.content = std::move(msg.content);
  out.reasoning_content = std::move(msg.reasoning_content);
  for (common_chat_tool_call& c : msg.tool_calls) {
    out.tool_calls.push_back({std::move(c.id), std::move(c.name), std::move(c.arguments)});
  }
  return out;
}

StatusOr<std::vector<ReplyDelta>> ReplyDeltas(const ParsedReply& before, const ParsedReply& after) {
  auto msg = [](const ParsedReply& r) {
    common_chat_msg m;
    m.role = "assistant";
    m.content = r.content;
    m.reasoning_content = r.reasoning_content;
    for (const ToolCall& c : r.tool_calls) m.tool_calls.push_back({c.name, c.arguments, c.id});
    return m;
  };
  std::vector<common_chat_msg_diff> diffs;
  try {
    diffs = common_chat_msg_diff::compute_diffs(msg(before), msg(after));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  std::vector<ReplyDelta> out;
  for (common_chat_msg_diff& d : diffs) {
    ReplyDelta r;
    r.content = std::move(d.content_delta);
    r.reasoning_content = std::move(d.reasoning_content_delta);
    if (d.tool_call_index != std::string::npos) {
      r.tool_call_index = d.tool_call_index;
      r.tool_call = {std::move(d.tool_call_delta.id), std::move(d.tool_call_delta.name),
                     std::move(d.tool_call_delta.arguments)};
    }
    out.push_back(std::move(r));
  }
  return out;
}

StatusOr<std::vector<ReplyDelta>> StreamDeltas(const ParsedReply& before, const ParsedReply& after, bool partial,
                                               std::vector<bool>& named) {
  SKIPPY_ASSIGN_OR_RETURN(std::vector<ReplyDelta> all, ReplyDeltas(before, after));
  named.resize(std::max(named.size(), after.tool_calls.size()), false);
  std::vector<ReplyDelta> out;
  auto name = [&](size_t i) {
    ReplyDelta header;
    header.tool_call_index = i;
    header.tool_call.id = after.tool_calls[i].id;
    header.tool_call.name = after.tool_calls[i].name;
    out.push_back(std::move(header));
    named[i] = true;
  };
  for (ReplyDelta& d : all) {
    for (size_t i = 0; i < after.tool_calls.size(); ++i) {
      if (named[i] || after.tool_calls[i].name.empty()) continue;
      if (d.tool_call_index != i || !d.tool_call.arguments.empty()) name(i);
    }
    if (!d.tool_call_index) {
      out.push_back(std::move(d));
      continue;
    }
    const size_t i = *d.tool_call_index;
    if (named[i]) {
      if (!d.tool_call.arguments.empty()) {
        d.tool_call.id.clear();
        d.tool_call.name.clear();
        out.push_back(std::move(d));
      }
    } else if (!d.tool_call.arguments.empty() || !partial) {
      d.tool_call.id = after.tool_calls[i].id;
      d.tool_call.name = after.tool_calls[i].name;
      out.push_back(std::move(d));
      named[i] = true;
    }
  }
  if (!partial) {
    for (size_t i = 0; i < after.tool_calls.size(); ++i) {
      if (!named[i] && !after.tool_calls[i].name.empty()) name(i);
    }
  }
  return out;
}

}  // namespace skippy::runtime
