# The serving stack end to end (label e2e): real connex-directory, connex-stage and connex-proxy
# processes, started with connex-chaos's Cluster (the fixture), completions checked with its
# chaos::Check. One binary per behaviour: a stage 0's API, the proxy, hostile clients.
add_library(serving_e2e_fixture STATIC ${CMAKE_CURRENT_LIST_DIR}/serving_e2e_fixture.cc)
target_link_libraries(serving_e2e_fixture PUBLIC connex_chaos connex_subprocess connex_base
                      nlohmann_json::nlohmann_json GTest::gtest)
connex_cold_code(serving_e2e_fixture)
foreach(test serving_e2e_test serving_e2e_proxy_test serving_e2e_hostile_test
             serving_e2e_tokenizer_test)
  # The real-tokenizer kill tests are the longest of the label (about 3 min each under ASan):
  # started first by `ctest -j`, not last.
  set(cost "")
  if(test STREQUAL "serving_e2e_tokenizer_test")
    set(cost COST 60)
  endif()
  connex_test(${test}
    SRCS ${CMAKE_CURRENT_LIST_DIR}/${test}.cc
    LIBS serving_e2e_fixture connex_serving connex_directory connex_tokenizer
         connex_chat_template nlohmann_json::nlohmann_json
    LABELS e2e ${cost})
  add_dependencies(${test} connex-stage connex-proxy connex-directory connex-mkmodel
                   connex-generate connexctl)
endforeach()
# The OpenAI client test runs tests/openai-client/stream.mjs (its node_modules: scripts/install-deps.sh).
target_compile_definitions(serving_e2e_proxy_test PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# The real-tokenizer test copies Llama 3.2's tokenizer files from tests/hf-tokenizers.
target_compile_definitions(serving_e2e_tokenizer_test PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# Prefill-decode disaggregation end to end (label pd): a frontend, prefill and decode instances.
connex_test(pd_e2e_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/pd_e2e_test.cc
  LIBS connex_chaos connex_subprocess connex_base
  LABELS pd)
add_dependencies(pd_e2e_test connex-stage connex-directory connex-mkmodel connex-generate)
