// Test models with a chat template of a test's choosing: a zoo GGUF copied with its
// tokenizer.chat_template replaced (the new metadata, then the source's tensor data), and a
// template that renders tools and tool calls the way Qwen2.5's and Hermes' do (<tool_call> blocks
// of {"name", "arguments"}, results in <tool_response> blocks of a user turn), written for these
// tests, and a variant that also writes an assistant's reasoning.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "gguf.h"

namespace skippy::testing_support {

inline void WriteWithChatTemplate(const std::string& src, const std::string& dst, const std::string& tmpl) {
  gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context* g = gguf_init_from_file(src.c_str(), params);
  ASSERT_NE(g, nullptr) << src;
  const size_t data_offset = gguf_get_data_offset(g);
  gguf_set_val_str(g, "tokenizer.chat_template", tmpl.c_str());
  ASSERT_TRUE(gguf_write_to_file(g, dst.c_str(), /*only_meta=*/true));
  gguf_free(g);
  std::ifstream in(src, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_offset));
  std::ofstream out(dst, std::ios::binary | std::ios::app);
  out << in.rdbuf();
  ASSERT_TRUE(out.good());
}

// `thinking`: an assistant's reasoning_content is written in <think></think> before its content or
// calls, as Qwen3's template writes it.
inline std::string ToolCallTemplate(bool thinking = false) {
  std::string t = R"TMPL({%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call functions. Their signatures are within <tools></tools>:\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nFor each call, write a JSON object with the function name and arguments within <tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' }}
@REASONING_BEFORE_CONTENT@{{- message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
@REASONING_BEFORE_CALLS@{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})TMPL";
  auto put = [&t](const std::string& at, const std::string& what) { t.replace(t.find(at), at.size(), what); };
  put("@REASONING_BEFORE_CONTENT@",
      thinking ? "{%- if message.role == 'assistant' and message.reasoning_content %}"
                 "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}\n"
               : "");
  put("@REASONING_BEFORE_CALLS@",
      thinking ? "{%- if message.reasoning_content %}{{- '\\n<think>\\n' + message.reasoning_content + '\\n</think>\\n' }}"
                 "{%- endif %}\n"
               : "");
  return t;
}

}  // namespace skippy::testing_support
