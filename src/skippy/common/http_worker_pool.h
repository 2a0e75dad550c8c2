// cpp-httplib's task queue on a WorkerPool (worker_pool.h): what skippy-server and skippy-router
// hand to httplib::Server::new_task_queue. A connection the pool refuses is closed by httplib at
// accept. Also the listening socket's options both servers set. Include httplib.h before this
// header (common itself does not link cpp-httplib).
#pragma once

#include <functional>

#include "skippy/common/worker_pool.h"

namespace skippy {

class HttpWorkerPool final : public httplib::TaskQueue {
 public:
  HttpWorkerPool(size_t base, size_t most, size_t most_waiting) : pool_(base, most, most_waiting) {}
  bool enqueue(std::function<void()> fn) override { return pool_.Submit(std::move(fn)); }
  void shutdown() override { pool_.Shutdown(); }

 private:
  WorkerPool pool_;
};

// The listening socket's options: SO_REUSEADDR only. cpp-httplib's default also sets
// SO_REUSEPORT, with which a second server on a port already in use binds too and the kernel
// splits connections between the two; without it the second bind fails ("cannot listen on"),
// as llama-server's does unless --reuse-port is given.
inline void SetExclusiveListenSocket(httplib::Server& server) {
  server.set_socket_options([](socket_t sock) { httplib::set_socket_opt(sock, SOL_SOCKET, SO_REUSEADDR, 1); });
}

}  // namespace skippy
