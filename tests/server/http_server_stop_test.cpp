// HttpServer::Stop from another thread at any moment ends Run: a Stop that comes before Run (a
// signal during start-up) makes Run return without binding the port or loading the model.
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "skippy/server/http_server.h"

namespace skippy::server {
namespace {

TEST(HttpServerStop, AStopBeforeRunEndsItWithoutBindingOrLoading) {
  ServerOptions o;
  o.model_path = "/nonexistent/model.gguf";  // a load would fail with an error, not an ok
  o.port = 1;                                // a bind would fail too (a privileged port, or taken)
  HttpServer server(o);
  server.Stop();
  auto run = std::async(std::launch::async, [&] { return server.Run(); });
  ASSERT_EQ(run.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(run.get().ok());
}

}  // namespace
}  // namespace skippy::server
