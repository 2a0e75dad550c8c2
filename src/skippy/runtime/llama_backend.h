// Process-wide llama.cpp setup for the runtime adapter: backend initialisation (once) and log
// routing. llama.cpp logs through a global callback; Skippy keeps it quiet unless SKIPPY_LLAMA_LOG=1
// and remembers the last error lines so a failed llama.cpp call becomes a readable Status.
//
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <string>

namespace skippy::runtime {

// Initialises the llama.cpp backend and installs the log router, and switches batch-invariant
// matrix products on where the loaded ggml has them (see below). Idempotent.
void EnsureLlamaBackend();

// Batch-invariant kernels come from Skippy's llama.cpp patch series (patches/llama.cpp): with
// them, a prompt row's matrix products on repacked quantized weights (Q4_K on x86, for one) and
// its flash attention are the same bits in any batch of two or more rows, as the products already
// are for F16 and the other weight types. Without them, a batch's size and a row's index in it
// change the last bits (repacked weights: any cut; flash attention: batches under 64 rows), and
// the startup batch-split check turns the cache off or raises the smallest batch.
//
// Available when the loaded libggml-cpu exports the switch (the bootstrap's patched build); a
// stock build (LLAMA_STAGE_BUILD_DIR, LLAMA_CPP_SOURCE_DIR) does not. On by default in Skippy's
// processes, from the first EnsureLlamaBackend or BatchInvariant call; SetBatchInvariant(false)
// before that keeps the stock kernels (for measuring them). The mode is process-wide and read
// when llama.cpp plans a graph: set it before creating contexts.
bool BatchInvariantAvailable();
// Returns false, changing nothing, when the mode is not available.
bool SetBatchInvariant(bool on);
bool BatchInvariant();

// The one-row class (a second switch of the patch series, in force only with the batch-invariant
// mode): a one-row batch takes the batch kernels too (padded GEMM groups for repacked weights,
// tinyBLAS for float weights, flash attention's tiled path), so every batch size is one class and
// a token decoded alone gets the bits it gets in any batch. What lets lanes decode together in one
// llama_decode without pad rows (Engine::DecodeStep). Off by default: it makes a lone decode step
// slower on some models and CPUs and faster on others (docs/evidence/one-row-class/,
// docs/evidence/lane-batching-auto/). Process-wide and read when llama.cpp plans a graph (every
// decode), so it may change between two decodes of a context (server::MeasureLoneStep times both
// classes that way), but it must be settled before a context computes anything that is kept: KV
// that is served, records, the startup checks. SetOneRowClass returns false, changing nothing,
// when the loaded libggml-cpu lacks it.
bool OneRowClassAvailable();
bool SetOneRowClass(bool on);
bool OneRowClass();

// The ragged split (the patch series' libllama switch, llama_batch_set_ragged_split): a
// llama_decode whose rows belong to several sequences in runs of unequal lengths (a prompt chunk
// of one lane and a generated token of others), or in runs of one row whose sequence ids do not
// follow each other (lanes 0, 2, 4 stepping), runs as one ubatch, each run computed as in a
// ubatch of its own, where the stock split makes several. Only for a context with one KV stream
// per sequence, and attention-only memory where runs are unequal; hybrid memory takes equal runs
// (Engine::CanStepWithChunk and CanStepLanesApart check). Per thread: a
// ScopedRaggedSplit applies to the llama_decode calls its thread makes while it lives, and
// nothing else (another thread's decode, a stock llama-server) sees it. Available where the
// loaded libllama exports it (the bootstrap's patched build).
bool RaggedSplitAvailable();
class ScopedRaggedSplit {
 public:
  ScopedRaggedSplit();
  ~ScopedRaggedSplit();
  ScopedRaggedSplit(const ScopedRaggedSplit&) = delete;
  ScopedRaggedSplit& operator=(const ScopedRaggedSplit&) = delete;

 private:
  bool on_;
};

// The CPU features ggml's CPU backend was compiled for (its kernels' vector widths and paths:
// the same commit adds in another order on another instruction set), comma-separated, and the
// environment switch that changes the IQ kernels.
std::string CpuKernelFeatures();

// The kernels a computation ran on, as part of an identity (cache entries on disk and in a shared
// tier, kept decisions): the pinned llama.cpp commit, the patch series' digest, the CPU features,
// and "+batch-invariant" when that mode is on (the one-row class is left to the caller: not every
// identity depends on it).
std::string KernelBuild();

// The most recent llama.cpp error/warning lines (newest last), joined; empty if none.
// Clears the buffer.
std::string TakeLlamaLogTail();

}  // namespace skippy::runtime
