# Imports a llama.cpp build made by scripts/bootstrap.sh (or brought by the user) as targets:
#   llama::llama  (libllama + libggml*, with include dirs for llama.h, ggml.h, gguf.h)
# Inputs: LLAMA_CPP_SOURCE_DIR and LLAMA_CPP_BUILD_DIR (cache variables or environment).
# Also links build/bin/llama-server, ggml-rpc-server, llama-quantize and llama-imatrix to the same
# build, so the baseline server is always the one built from the llama.cpp we link against. With
# the bootstrap's patch series, LLAMA_CPP_BUILD_DIR's bin/ holds the patched ggml libraries (what
# Skippy links) and links to the stock build for everything else: the tools are stock.

foreach(var LLAMA_CPP_SOURCE_DIR LLAMA_CPP_BUILD_DIR)
  if(NOT ${var} AND DEFINED ENV{${var}})
    set(${var} "$ENV{${var}}")
  endif()
  set(${var} "${${var}}" CACHE PATH "llama.cpp ${var}")
  if(NOT ${var})
    message(FATAL_ERROR "${var} is not set: run scripts/bootstrap.sh (scripts/test.sh does it for you)")
  endif()
endforeach()

if(NOT EXISTS "${LLAMA_CPP_SOURCE_DIR}/include/llama.h")
  message(FATAL_ERROR "LLAMA_CPP_SOURCE_DIR=${LLAMA_CPP_SOURCE_DIR} has no include/llama.h")
endif()

set(_llama_libs llama ggml ggml-base ggml-cpu ggml-rpc)
set(_llama_targets)
foreach(lib ${_llama_libs})
  set(_path "${LLAMA_CPP_BUILD_DIR}/bin/lib${lib}.so")
  if(NOT EXISTS "${_path}")
    message(FATAL_ERROR "llama.cpp build ${LLAMA_CPP_BUILD_DIR} lacks ${_path}")
  endif()
  add_library(llama_imported_${lib} SHARED IMPORTED)
  set_target_properties(llama_imported_${lib} PROPERTIES IMPORTED_LOCATION "${_path}")
  list(APPEND _llama_targets llama_imported_${lib})
endforeach()

add_library(skippy_llama INTERFACE)
target_link_libraries(skippy_llama INTERFACE ${_llama_targets})
target_include_directories(skippy_llama SYSTEM INTERFACE
  "${LLAMA_CPP_SOURCE_DIR}/include" "${LLAMA_CPP_SOURCE_DIR}/ggml/include")
add_library(llama::llama ALIAS skippy_llama)

# Record the llama.cpp version we build against (commit of the source tree when it is a git tree).
execute_process(COMMAND git -C "${LLAMA_CPP_SOURCE_DIR}" rev-parse HEAD
  OUTPUT_VARIABLE SKIPPY_LLAMA_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT SKIPPY_LLAMA_COMMIT)
  set(SKIPPY_LLAMA_COMMIT "unknown")
endif()
# The patch series applied to that tree (scripts/bootstrap.sh writes its digest); "none" for a
# stock tree. Part of the runtime identity of every cache entry, beside the commit.
set(SKIPPY_LLAMA_PATCHES "none")
if(EXISTS "${LLAMA_CPP_SOURCE_DIR}/.skippy-patches")
  file(STRINGS "${LLAMA_CPP_SOURCE_DIR}/.skippy-patches" SKIPPY_LLAMA_PATCHES LIMIT_COUNT 1)
endif()

file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/bin")
foreach(tool llama-server ggml-rpc-server llama-quantize llama-imatrix)
  file(CREATE_LINK "${LLAMA_CPP_BUILD_DIR}/bin/${tool}" "${CMAKE_BINARY_DIR}/bin/${tool}" SYMBOLIC)
endforeach()
set(SKIPPY_LLAMA_SERVER "${CMAKE_BINARY_DIR}/bin/llama-server")
set(SKIPPY_LLAMA_VOCAB_DIR "${LLAMA_CPP_SOURCE_DIR}/models")
