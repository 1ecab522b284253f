# The OpenAI stream reader of connex/serving (what the proxy reads from a replica and connex-chaos
# from its answers), fed arbitrary bytes in arbitrary pieces.
if(CONNEX_FUZZ)
  add_executable(fuzz_openai_stream
    ${CMAKE_CURRENT_LIST_DIR}/openai_stream_fuzzer.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/api_error.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/openai_api.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/openai_response.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/openai_stream.cc)
  target_compile_options(fuzz_openai_stream PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_openai_stream PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_openai_stream PRIVATE connex_base nlohmann_json::nlohmann_json)
  if(TARGET fuzzers)
    add_dependencies(fuzzers fuzz_openai_stream)
  endif()
endif()
