// Fuzz target: a GGUF file as a user would hand it to any Skippy tool (--model), through
// InspectGgufFile, the check that runs before llama.cpp loads tensors: magic, llama.cpp's GGUF
// header parser (gguf.cpp), and tensor data inside the file. None may crash, read out of bounds
// or allocate without bound; a file it accepts must hold every tensor's bytes.
//
// In the libFuzzer build gguf.cpp is compiled into this target from the pinned tree, so coverage
// reaches inside the parser (the llama.cpp libraries themselves are not instrumented).
// The input lives in a memfd, so each run costs no disk I/O.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "skippy/runtime/model.h"

namespace {

// The memfd every input is written to, opened once, and the path InspectGgufFile reads it by.
struct Input {
  int fd = -1;
  std::string path;
};

const Input& TheInput() {
  static const Input input = [] {
    Input in;
    in.fd = memfd_create("skippy-fuzz-gguf", 0);
    if (in.fd < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    in.path = "/proc/self/fd/" + std::to_string(in.fd);
    return in;
  }();
  return input;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Input& in = TheInput();
  const int fd = in.fd;
  if (ftruncate(fd, 0) != 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  auto summary = skippy::runtime::InspectGgufFile(in.path);
  if (summary.ok() && summary->file_bytes != size) std::abort();
  return 0;
}
