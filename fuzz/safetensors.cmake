# The safetensors header parser and tensor reader, fed arbitrary bytes. The parser's sources are
# compiled into the fuzzer so that libFuzzer's coverage instrumentation sees them.
if(CONNEX_FUZZ)
  add_executable(fuzz_safetensors
    ${CMAKE_CURRENT_LIST_DIR}/safetensors_fuzzer.cc
    ${PROJECT_SOURCE_DIR}/connex/engine/model_config.cc
    ${PROJECT_SOURCE_DIR}/connex/engine/safetensors.cc
    ${PROJECT_SOURCE_DIR}/connex/pp/tensor_dict.cc)
  target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_safetensors PRIVATE connex_base nlohmann_json::nlohmann_json)
  if(TARGET fuzzers)
    add_dependencies(fuzzers fuzz_safetensors)
  endif()
endif()
