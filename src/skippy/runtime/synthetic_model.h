// Writes a synthetic-weight GGUF for one zoo family (src/skippy/zoo/zoo_spec.h).
//
// How: the family's metadata plus the `tokenizer.*` keys of the pinned tree's
// models/ggml-vocab-<name>.gguf go into a GGUF context; llama.cpp's llama_model_init_from_user()
// instantiates the architecture from that metadata, which tells us every tensor the real loader
// expects (names and shapes, optional ones included); we then write the file ourselves with ggml's
// gguf writer (meta first, tensor data streamed), because llama_model_save_to_file() aborts for
// several architectures. Weights are deterministic: a SplitMix64 stream per tensor seeded by the
// family seed and the tensor name, normal values scaled by 1/sqrt(fan-in), norms near 1, SSM decay
// terms negative. Matrices are F16, vectors F32. The same (family, preset, seed, generator version,
// llama.cpp version) gives a byte-identical file.
//
// Thread-safety: may run concurrently for different output paths.
#pragma once

#include <cstdint>
#include <string>

#include "skippy/common/status.h"
#include "skippy/zoo/zoo_spec.h"

namespace skippy::runtime {

struct SyntheticModelInfo {
  std::string path;
  uint64_t n_params = 0;     // exact, from the written tensors
  uint64_t file_bytes = 0;
  uint32_t n_vocab = 0;
  uint32_t n_tensors = 0;
  std::string spec_digest;   // identifies what generated the file (see SyntheticSpecDigest)
};

// A digest over everything that determines the file's bytes: the family's metadata for the
// preset, the tokenizer file's digest, the generator version and the llama.cpp commit.
StatusOr<std::string> SyntheticSpecDigest(const zoo::FamilySpec& family, zoo::Preset preset,
                                          const std::string& vocab_dir);

// Writes `out_path` atomically (temp file + rename). `vocab_dir` holds ggml-vocab-*.gguf.
// Errors: NotFound (vocab file), InvalidArgument (llama.cpp rejected the metadata),
// Internal (I/O).
StatusOr<SyntheticModelInfo> WriteSyntheticModel(const zoo::FamilySpec& family, zoo::Preset preset,
                                                 const std::string& vocab_dir, const std::string& out_path);

}  // namespace skippy::runtime
