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
// Tools (OpenAI function calling): RenderChat with ChatTools renders the tools as llama-server
// does (common_chat_templates_apply with the tools, the tool choice and parallel calls), and the
// RenderedChat then says how the answer is sampled and read back (ToolCalling): the grammar
// llama.cpp derives for the template's call syntax (lazy, behind trigger words or tokens, when the
// model may also answer in text), the tokens to keep as text, the extra stop strings, and the
// parser that splits the answer into content and tool calls (ReplyParser).
//
// Thread-safety: pure functions of an immutable Model; a ReplyParser is immutable after Create.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "skippy/common/status.h"
#include "skippy/runtime/model.h"
#include "skippy/runtime/sampler.h"

namespace skippy::runtime {

// A function call an assistant made (OpenAI's tool_calls entry).
struct ToolCall {
  std::string id;         // may be empty (the model's format had none)
  std::string name;
  std::string arguments;  // JSON text, as the model wrote it
  bool operator==(const ToolCall&) const = default;
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool", ...
  std::string content;  // with text_parts: the parts joined with newlines, as llama.cpp joins them
  // The content as OpenAI text parts, when it came so: the Jinja template gets them as parts, as
  // llama-server passes them (a template that reads typed content joins them its own way).
  std::vector<std::string> text_parts{};
  std::vector<ToolCall> tool_calls{};  // an assistant's calls
  std::string tool_call_id{};          // a tool result: the call it answers
  std::string name{};                  // a tool result: the tool's name
  std::string reasoning_content{};     // an assistant's reasoning, as a chat with tools answered it
};

// A function the model may call (OpenAI's tools entry of type "function").
struct ChatTool {
  std::string name;
  std::string description;
  std::string parameters;  // JSON schema text ("{}" when the tool takes none)
};

enum class ToolChoice { kAuto, kRequired, kNone };

struct ChatTools {
  std::vector<ChatTool> tools;
  ToolChoice choice = ToolChoice::kAuto;
  std::optional<bool> parallel_calls;  // nullopt: as the template supports (llama-server's default)
  // Whether the answer may call a tool (and so is constrained by the calls' grammar).
  bool active() const { return !tools.empty() && choice != ToolChoice::kNone; }
};

// How an answer to a chat with tools is sampled and read back: llama.cpp's common_chat_params.
struct ToolCalling {
  std::string grammar;  // GBNF for the answer ("" with tool choice none on some templates)
  // Lazy: the grammar applies from the first trigger on (the model may answer in text before it).
  bool grammar_lazy = false;
  std::vector<std::string> trigger_patterns;  // regular expressions over the generated text
  std::vector<Token> trigger_tokens;
  // Not lazy: the tokens the grammar reads before the first generated one (the generation prompt,
  // which the grammar spells out).
  std::vector<Token> grammar_prefill;
  // A template that thinks: the tokens that open and close a reasoning block, and the generation
  // prompt's, for a lazy grammar kept out of the block (SamplingParams::reasoning_start ...).
  std::vector<Token> reasoning_start;
  std::vector<std::vector<Token>> reasoning_end;
  std::vector<Token> generation_prompt_tokens;
  std::vector<Token> preserved_tokens;  // special tokens the answer keeps as text (a call's markers)
  std::vector<std::string> stops;       // more stop strings
  std::string generation_prompt;        // the text the parser reads before the answer
  std::string parser;                   // llama.cpp's serialized PEG parser ("" for content only)
  int format = 0;                       // common_chat_format
  bool parse_tool_calls = true;         // false with tool choice none
  // The final assistant message is continued: the generation prompt holds what it began with, which
  // the parser reads but a reply leaves out (the answer is what was generated, as without tools).
  bool continues = false;
};

// Sets `params`' grammar to the calls' (with its triggers, prefill and reasoning block), where the
// calls have a grammar (not with tool choice none, on most templates); leaves it otherwise.
void ConstrainToCalls(const ToolCalling& calling, SamplingParams& params);

struct RenderedChat {
  std::string text;
  std::string template_name;
  std::vector<size_t> message_ends;  // byte offsets into text, ascending; empty if unknown
  std::optional<ToolCalling> tool_calling;  // set when ChatTools with tools were given
};

// InvalidArgument for no messages, a message with an empty role, two assistant messages at the end
// (with add_assistant_prompt), a final assistant message with tool calls to continue, messages the
// model's template refuses, or tools on a model whose template llama.cpp cannot derive a call
// syntax for (then also tools without a Jinja template).
[[nodiscard]] StatusOr<RenderedChat> RenderChat(const Model& model, const std::vector<ChatMessage>& messages,
                                                bool add_assistant_prompt = true, size_t ends = 2,
                                                const ChatTools* tools = nullptr);

// An assistant's answer read back with the chat's ToolCalling: its text, its reasoning (a thinking
// block the template opens) and its tool calls.
struct ParsedReply {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ParsedReply&) const = default;
};

// One change from one ParsedReply to the next, as a stream sends it (OpenAI's delta): text added
// to the content or the reasoning, or to one tool call (its id and name when they are new, and
// arguments added).
struct ReplyDelta {
  std::string content;
  std::string reasoning_content;
  std::optional<size_t> tool_call_index;
  ToolCall tool_call;  // with tool_call_index: id and name when new, arguments added
};

class ReplyParser {
 public:
  // InvalidArgument for a parser llama.cpp cannot load.
  [[nodiscard]] static StatusOr<std::shared_ptr<const ReplyParser>> Create(const ToolCalling& calling);
  ~ReplyParser();
  // `partial`: the text so far of an answer still being generated (a call may be cut off; what is
  // parsed is kept). A whole answer that does not follow the format is InvalidArgument.
  [[nodiscard]] StatusOr<ParsedReply> Parse(const std::string& text, bool partial) const;

 private:
  struct Impl;
  explicit ReplyParser(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The deltas that take `before` to `after` (llama.cpp's common_chat_msg_diff). InvalidArgument when
// `after` does not extend `before` (a call disappeared or its text changed).
[[nodiscard]] StatusOr<std::vector<ReplyDelta>> ReplyDeltas(const ParsedReply& before, const ParsedReply& after);

// ReplyDeltas as a stream sends them (llama-server's filtered tool-call deltas): each call's id and
// name go out once, whole, with its first arguments, before a delta of anything else, or when the
// answer is whole (`partial` false). A partial parse may read a name that is still growing, and
// clients add up what deltas send. `named` holds, per call, whether its id and name went out.
[[nodiscard]] StatusOr<std::vector<ReplyDelta>> StreamDeltas(const ParsedReply& before, const ParsedReply& after,
                                                             bool partial, std::vector<bool>& named);

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
