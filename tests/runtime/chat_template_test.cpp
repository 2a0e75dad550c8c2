// A chat the model's own template refuses (raise_exception, as Gemma's templates do for roles
// that do not alternate) is an error with the template's message, never a prompt rendered in
// another template's format. The model is the tiny Llama with its template replaced.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gguf.h"
#include "skippy/runtime/chat.h"
#include "skippy/runtime/llama_backend.h"
#include "skippy/runtime/model.h"
#include "test_env.h"

namespace skippy::runtime {
namespace {

namespace fs = std::filesystem;

constexpr const char* kAlternating =
    "{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{{ '<turn>' + m['role'] + '\\n' + m['content'] + '</turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<turn>assistant\\n' }}{% endif %}";

// `src` with its tokenizer.chat_template replaced: the new metadata, then src's tensor data.
void WithTemplate(const std::string& src, const std::string& dst, const char* tmpl) {
  gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context* g = gguf_init_from_file(src.c_str(), params);
  ASSERT_NE(g, nullptr);
  const size_t data_offset = gguf_get_data_offset(g);
  gguf_set_val_str(g, "tokenizer.chat_template", tmpl);
  ASSERT_TRUE(gguf_write_to_file(g, dst.c_str(), /*only_meta=*/true));
  gguf_free(g);
  std::ifstream in(src, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_offset));
  std::ofstream out(dst, std::ios::binary | std::ios::app);
  out << in.rdbuf();
  ASSERT_TRUE(out.good());
}

TEST(ChatTemplate, MessagesTheTemplateRefusesAreAnErrorNotAnotherFormat) {
  const std::string path =
      (fs::temp_directory_path() / ("skippy-chat-template-" + std::to_string(::getpid()) + ".gguf")).string();
  WithTemplate(testing_env::ZooFile("llama"), path, kAlternating);
  EnsureLlamaBackend();
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();

  const std::vector<ChatMessage> alternating = {{"user", "Name a river."}, {"assistant", "The Nile."}, {"user", "Another?"}};
  auto ok = RenderChat(**model, alternating, true);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->template_name, "jinja");
  EXPECT_EQ(ok->text.rfind("<turn>user\nName a river.</turn>\n", 0), 0u) << ok->text;

  const std::vector<ChatMessage> two_users = {{"user", "Name a river."}, {"user", "Another?"}};
  auto refused = RenderChat(**model, two_users, true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << (refused.ok() ? refused->text : "");
  EXPECT_NE(refused.status().message().find("roles must alternate"), std::string_view::npos) << refused.status();
  fs::remove(path);
}

}  // namespace
}  // namespace skippy::runtime
