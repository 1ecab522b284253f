# bench_handover: kill a pipeline stage mid-generation in a real multi-process deployment and
# time the handover (kill -> next token) against the steady-state token gap.
add_executable(bench_handover ${CMAKE_CURRENT_LIST_DIR}/handover_bench.cc)
target_link_libraries(bench_handover PRIVATE connex_subprocess connex_engine connex_cli
                      nlohmann_json::nlohmann_json)
add_dependencies(bench_handover pp_test_node connex-directory connex-mkmodel)
