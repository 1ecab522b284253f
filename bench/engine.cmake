# bench_engine: decode and prefill tokens/s of the reference engine on the default model
# (connex-mkmodel's defaults), next to the machine's fp32 matrix-vector bound (streaming read
# bandwidth and the engine's own sgemv kernel on a matrix larger than the caches); with
# --vs-bound, batch-1 decode of BF16 and F32 weights against the memory bound in the same run.
add_executable(bench_engine ${CMAKE_CURRENT_LIST_DIR}/engine_bench.cc
                            ${CMAKE_CURRENT_LIST_DIR}/engine_vs_bound.cc)
target_link_libraries(bench_engine PRIVATE connex_engine connex_cli benchmark::benchmark)
target_compile_options(bench_engine PRIVATE -O3)
# BM_LoadTokenizer reads tests/hf-tokenizers' packages.
target_compile_definitions(bench_engine PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
if(CONNEX_MARCH)
  target_compile_options(bench_engine PRIVATE -march=${CONNEX_MARCH})
endif()
