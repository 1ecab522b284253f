# Every binary run with bad flags (exit 2 and a message naming the flag), and every flag of every
# binary checked against docs/configuration.md.
connex_test(cli_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cli_test.cc
  LIBS connex_subprocess
  LABELS cli)
target_compile_definitions(cli_test PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                            CONNEX_VERSION="${PROJECT_VERSION}")
add_dependencies(cli_test connex-bench connex-chaos connex-directory connex-generate connex-mkmodel connex-proxy connex-stage
                 connexctl
                 bench_directory bench_engine bench_handover bench_pp_memory pp_test_node mobile_endpoints
                 two_stage_pipeline)
