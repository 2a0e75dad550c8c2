// A sink for Completion::Stream in tests: it keeps a stream's data events, parsed.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "httplib.h"
#include "nlohmann/json.hpp"

namespace skippy::server {

// A sink that keeps a stream's data events, parsed (but [DONE]); Await blocks until it holds n of them.
struct Events {
  Events() {
    sink.write = [this](const char* data, size_t n) {
      const std::string line(data, n);
      if (line.rfind("data: [DONE]", 0) == 0) {
        done_marker = true;
      } else if (line.rfind("data: ", 0) == 0) {
        std::lock_guard lock(mu);
        events.push_back(nlohmann::json::parse(line.substr(6)));
        cv.notify_all();
      }
      return true;
    };
    sink.is_writable = [] { return true; };
    sink.done = [] {};
  }
  void Await(size_t n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return events.size() >= n; });
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<nlohmann::json> events;
  bool done_marker = false;  // an OpenAI stream's "data: [DONE]"
  httplib::DataSink sink;
};

}  // namespace skippy::server
