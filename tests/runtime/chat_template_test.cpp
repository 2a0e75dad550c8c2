// A chat the model's own template refuses (raise_exception, as Gemma's templates do for roles
// that do not alternate) is an error with the template's message, never a prompt rendered in
// another template's format. The model is the tiny Llama with its template replaced.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "../support/chat_template_gguf.h"
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

TEST(ChatTemplate, MessagesTheTemplateRefusesAreAnErrorNotAnotherFormat) {
  const std::string path =
      (fs::temp_directory_path() / ("skippy-chat-template-" + std::to_string(::getpid()) + ".gguf")).string();
  testing_support::WriteWithChatTemplate(testing_env::ZooFile("llama"), path, kAlternating);
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
