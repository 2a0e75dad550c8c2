// The official openai npm client (installed into the build tree by the server.npm_install_openai
// fixture) talks to a real skippy-server: chat, completion, streamed chat, auth.
#include <gtest/gtest.h>

#include "server_process.h"

namespace {

using skippy::server_test::ServerProcess;

TEST(OpenAiNodeClient, ChatCompletionAndStreamedChat) {
  auto server = ServerProcess::Start("qwen3", {"-c", "512", "--api-key", "node-test-key"}, "openai");
  ASSERT_TRUE(server);
  const std::string log = server->log() + ".node";
  auto node = skippy::Subprocess::Start(
      {SKIPPY_TEST_NODE, SKIPPY_TEST_OPENAI_SCRIPT, SKIPPY_TEST_NODE_MODULES,
       skippy::StrCat("http://127.0.0.1:", server->port(), "/v1"), "node-test-key"},
      log);
  ASSERT_TRUE(node.ok()) << node.status();
  std::optional<int> rc;
  for (int i = 0; i < 1200 && !rc; ++i) {
    rc = node->Poll();
    if (!rc) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!rc) rc = node->Stop();
  EXPECT_EQ(*rc, 0) << "node output:\n" << skippy::TailOfFile(log) << "\nserver log:\n" << server->LogTail();
}

}  // namespace
