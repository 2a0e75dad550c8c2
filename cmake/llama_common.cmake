# The part of llama.cpp's common library that renders chat templates the way llama-server does
# (its Jinja engine, common_chat_templates_*), compiled from the pinned tree with this build's
# flags as skippy::llama_common. Compiled here rather than linked from the bootstrap's
# libllama-common.so because that library exports its own build of cpp-httplib (which would clash
# with skippy::httplib) and because a sanitizer build must instrument the template engine too:
# chat templates come from the model file, so they are input.
#
# Only what the chat functions reach: no downloads, no HTTP, no argument parsing. A llama.cpp
# update that moves a chat function into a file not listed here fails at link time.
set(_common_dir "${LLAMA_CPP_SOURCE_DIR}/common")
set(_common_sources
  chat.cpp chat-auto-parser-generator.cpp chat-auto-parser-helpers.cpp chat-diff-analyzer.cpp
  chat-peg-parser.cpp common.cpp fit.cpp json.cpp json-schema-to-grammar.cpp log.cpp
  ngram-cache.cpp ngram-map.cpp ngram-mod.cpp peg-parser.cpp reasoning-budget.cpp sampling.cpp
  speculative.cpp trie.cpp unicode.cpp
  jinja/caps.cpp jinja/lexer.cpp jinja/parser.cpp jinja/runtime.cpp jinja/string.cpp jinja/value.cpp)
list(TRANSFORM _common_sources PREPEND "${_common_dir}/")

# build-info.cpp as llama.cpp's CMake writes it (common.cpp reports the build through it).
set(LLAMA_BUILD_NUMBER 0)
set(LLAMA_BUILD_COMMIT "${SKIPPY_LLAMA_COMMIT}")
set(BUILD_COMPILER "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
set(BUILD_TARGET "${CMAKE_SYSTEM_PROCESSOR}")
configure_file("${_common_dir}/build-info.cpp.in" "${CMAKE_CURRENT_BINARY_DIR}/llama-common/build-info.cpp")

add_library(skippy_llama_common STATIC ${_common_sources} "${CMAKE_CURRENT_BINARY_DIR}/llama-common/build-info.cpp")
# Users include "common/chat.h"; llama.cpp's vendored nlohmann-json stays private (skippy uses
# Debian's, another version in another inline namespace).
target_include_directories(skippy_llama_common SYSTEM PUBLIC "${LLAMA_CPP_SOURCE_DIR}")
target_include_directories(skippy_llama_common SYSTEM PRIVATE "${_common_dir}" "${LLAMA_CPP_SOURCE_DIR}/vendor")
target_compile_options(skippy_llama_common PRIVATE -w)
target_link_libraries(skippy_llama_common PUBLIC llama::llama Threads::Threads)
add_library(skippy::llama_common ALIAS skippy_llama_common)
