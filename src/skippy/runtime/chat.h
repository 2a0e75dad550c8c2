// Chat prompts: rendering OpenAI-style messages into prompt text with the model's chat template.
//
// RenderChat renders like llama-server: the GGUF's template (tokenizer.chat_template) run by
// llama.cpp's Jinja engine (common_chat_templates, compiled from the pinned tree; without a
// template, llama.cpp's default), with the assistant header and llama-server's default thinking
// setting. A conversation that ends in an assistant message is rendered to continue that message
// (no end of turn after it, no new header), as llama-server's default prefill_assistant does. A template that throws on the messages (raise_exception: roles that do not alternate,
// ...) is an InvalidArgument with its message, as llama-server answers an error. If the template
// does not compile, llama_chat_apply_template's
// built-in list of well-known templates (ChatML, Llama 3, Gemma, ...) is tried, and then ChatML:
//     <|im_start|>{role}\n{content}<|im_end|>\n   per message, then "<|im_start|>assistant\n"
// (template_name says which: "jinja", "gguf" or "chatml-fallback"). tests/zoo checks the text
// equals llama-server's /apply-template for every zoo family.
//
// message_ends holds byte offsets in `text` where a message ends (the rendering of the messages up
// to it is a prefix of the whole rendering there), for the last `ends` messages before the final
// one, ascending; it is empty when a template does not render prefixes that way. Callers use it
// for record planning, which needs the last boundary before the final turn. Each end costs one
// more rendering of the conversation, so the work is linear in the number of messages for a
// fixed `ends` (rendering every end would be quadratic).
//
// Thread-safety: pure functions of an immutable Model.
#pragma once

#include <string>
#include <vector>

#include "skippy/common/status.h"
#include "skippy/runtime/model.h"

namespace skippy::runtime {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;  // with text_parts: the parts joined with newlines, as llama.cpp joins them
  // The content as OpenAI text parts, when it came so: the Jinja template gets them as parts, as
  // llama-server passes them (a template that reads typed content joins them its own way).
  std::vector<std::string> text_parts{};
};

struct RenderedChat {
  std::string text;
  std::string template_name;
  std::vector<size_t> message_ends;  // byte offsets into text, ascending; empty if unknown
};

// InvalidArgument for no messages, a message with an empty role, two assistant messages at the end
// (with add_assistant_prompt), or messages the model's template refuses.
[[nodiscard]] StatusOr<RenderedChat> RenderChat(const Model& model, const std::vector<ChatMessage>& messages,
                                                bool add_assistant_prompt = true, size_t ends = 2);

// The tokens a conversation's next request starts with when the client sends `reply` back as the
// assistant's message (appended to the final one where that was continued) and adds a user message: `messages`, the reply and a user message rendered
// (RenderChat, no assistant header) and tokenized, up to where the user message's content begins
// (where the tokens of two renderings with different contents part). The reply is the text the
// client got, not the tokens generated: it may tokenize to other tokens, and the template may
// render it or the earlier messages otherwise than the request's own prompt. Two renderings and
// tokenizations of the whole conversation.
[[nodiscard]] StatusOr<std::vector<Token>> NextTurnPrefix(const Model& model, std::vector<ChatMessage> messages,
                                                          std::string reply);

// The same for a raw text prompt, whose next turn is the prompt, the reply and more text: the
// tokens of `text` (prompt and reply) that stay the same whatever follows (where its
// tokenizations followed by a newline, a space and a letter part). Three tokenizations of it.
[[nodiscard]] StatusOr<std::vector<Token>> NextTextPrefix(const Model& model, const std::string& text);

}  // namespace skippy::runtime
