# The serving stack end to end (label e2e): real connex-directory and connex-stage processes.
connex_test(serving_e2e_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/serving_e2e_test.cc
  LIBS connex_subprocess connex_serving connex_directory connex_base nlohmann_json::nlohmann_json
  LABELS e2e)
add_dependencies(serving_e2e_test connex-stage connex-proxy connex-directory connex-mkmodel
                 connex-generate connexctl)
# The OpenAI client test runs tests/openai-client/stream.mjs (its node_modules: scripts/install-deps.sh).
target_compile_definitions(serving_e2e_test PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
