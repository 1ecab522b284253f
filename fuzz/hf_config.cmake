# Hugging Face's config.json and generation_config.json readers (ModelConfig::FromJson,
# ApplyGenerationConfig) and the RoPE frequencies of what they accept, fed arbitrary bytes.
if(CONNEX_FUZZ)
  add_executable(fuzz_hf_config
    ${CMAKE_CURRENT_LIST_DIR}/hf_config_fuzzer.cc
    ${PROJECT_SOURCE_DIR}/connex/engine/hf_config.cc
    ${PROJECT_SOURCE_DIR}/connex/engine/model_config.cc
    ${PROJECT_SOURCE_DIR}/connex/engine/rope.cc)
  target_compile_options(fuzz_hf_config PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_hf_config PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_hf_config PRIVATE connex_base nlohmann_json::nlohmann_json)
  if(TARGET fuzzers)
    add_dependencies(fuzzers fuzz_hf_config)
  endif()
endif()
