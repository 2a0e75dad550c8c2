// Process-wide llama.cpp setup for the runtime adapter: backend initialisation (once) and log
// routing. llama.cpp logs through a global callback; Skippy keeps it quiet unless SKIPPY_LLAMA_LOG=1
// and remembers the last error lines so a failed llama.cpp call becomes a readable Status.
//
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <string>

namespace skippy::runtime {

// Initialises the llama.cpp backend and installs the log router. Idempotent.
void EnsureLlamaBackend();

// The most recent llama.cpp error/warning lines (newest last), joined; empty if none.
// Clears the buffer.
std::string TakeLlamaLogTail();

}  // namespace skippy::runtime
