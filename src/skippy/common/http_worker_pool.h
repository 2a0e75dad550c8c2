// cpp-httplib's task queue on a WorkerPool (worker_pool.h): what skippy-server and skippy-router
// hand to httplib::Server::new_task_queue. A connection the pool refuses is closed by httplib at
// accept. Include httplib.h before this header (common itself does not link cpp-httplib).
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

}  // namespace skippy
