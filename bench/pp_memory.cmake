# bench_pp_memory: a pipeline's resident memory after 100 and after 10 000 requests, with a last
# stage that returns logits of vocabulary 32000 (issue 9: nothing a request leaves grows).
add_executable(bench_pp_memory ${CMAKE_CURRENT_LIST_DIR}/pp_memory_bench.cc)
target_link_libraries(bench_pp_memory PRIVATE connex_pp_testing connex_cli)
