# cpp-httplib from the pinned llama.cpp tree (vendor/cpp-httplib, 0.54.x): the HTTP stack
# llama-server itself runs, compiled here with this build's flags (sanitizers included) as
# skippy::httplib. Debian bookworm's libcpp-httplib-dev is 0.11.4, which has no way for a handler
# to see that its client left (needed to cancel a non-streaming generation), a fixed-size worker
# pool that a few slow clients exhaust, and no bound on queued connections.
if(NOT LLAMA_CPP_SOURCE_DIR AND DEFINED ENV{LLAMA_CPP_SOURCE_DIR})
  set(LLAMA_CPP_SOURCE_DIR "$ENV{LLAMA_CPP_SOURCE_DIR}")
endif()
set(_httplib_dir "${LLAMA_CPP_SOURCE_DIR}/vendor/cpp-httplib")
if(NOT EXISTS "${_httplib_dir}/httplib.cpp")
  message(FATAL_ERROR "no cpp-httplib at ${_httplib_dir}: set LLAMA_CPP_SOURCE_DIR (scripts/bootstrap.sh)")
endif()
find_package(Threads REQUIRED)
add_library(skippy_httplib STATIC "${_httplib_dir}/httplib.cpp")
target_include_directories(skippy_httplib SYSTEM PUBLIC "${_httplib_dir}")
target_compile_options(skippy_httplib PRIVATE -w)
target_link_libraries(skippy_httplib PUBLIC Threads::Threads)
# Header count: skippy-server's own cap (--max-headers, 431 with an error body) sits below this
# backstop, which stops reading a request's headers at all (400) and so bounds their memory.
target_compile_definitions(skippy_httplib PUBLIC CPPHTTPLIB_HEADER_MAX_COUNT=1024 CPPHTTPLIB_LISTEN_BACKLOG=512)
add_library(skippy::httplib ALIAS skippy_httplib)
