// The official openai clients talk to a real skippy-server: the npm package (v4) and the Python
// package (v1), each installed once into the cache outside the checkout by a fixture. Chat,
// completion, streamed chat, auth; the Python one also log-probabilities and a 400.
#include <gtest/gtest.h>

#include "server_process.h"

namespace {

using skippy::server_test::ServerProcess;

// Starts a server on the tiny qwen3 and runs `client_argv` + {base URL, key}; expects exit 0.
void RunClient(std::vector<std::string> client_argv, const std::string& tag) {
  auto server = ServerProcess::Start("qwen3", {"-c", "512", "--api-key", "client-test-key"}, tag);
  ASSERT_TRUE(server);
  const std::string log = server->log() + ".client";
  client_argv.push_back(skippy::StrCat("http://127.0.0.1:", server->port(), "/v1"));
  client_argv.push_back("client-test-key");
  auto client = skippy::Subprocess::Start(client_argv, log);
  ASSERT_TRUE(client.ok()) << client.status();
  std::optional<int> rc = client->Wait(std::chrono::seconds(60));
  if (!rc) rc = client->Stop();
  EXPECT_EQ(*rc, 0) << "client output:\n" << skippy::TailOfFile(log) << "\nserver log:\n" << server->LogTail();
}

#ifdef SKIPPY_TEST_NODE
TEST(OpenAiClient, Node) {
  RunClient({SKIPPY_TEST_NODE, SKIPPY_TEST_OPENAI_NODE_SCRIPT, SKIPPY_TEST_NODE_MODULES}, "openai-node");
}
#endif

#ifdef SKIPPY_TEST_PYTHON
TEST(OpenAiClient, Python) {
  RunClient({SKIPPY_TEST_PYTHON, SKIPPY_TEST_OPENAI_PYTHON_SCRIPT, SKIPPY_TEST_PYTHON_PACKAGES}, "openai-python");
}
#endif

}  // namespace
