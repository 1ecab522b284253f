# The OpenAI request parser of connex/serving, fed arbitrary request bodies, and what a stage does
# with an accepted request before the engine: the chat template, the stop-string filter and the
# response builders (which must survive any bytes as text).
if(CONNEX_FUZZ)
  add_executable(fuzz_openai_request
    ${CMAKE_CURRENT_LIST_DIR}/openai_request_fuzzer.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/api_error.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/chat_template.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/openai_api.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/openai_response.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/openai_stream.cc
    ${PROJECT_SOURCE_DIR}/connex/serving/stop_strings.cc)
  target_compile_options(fuzz_openai_request PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_openai_request PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_openai_request PRIVATE connex_base nlohmann_json::nlohmann_json)
  if(TARGET fuzzers)
    add_dependencies(fuzzers fuzz_openai_request)
  endif()
endif()
