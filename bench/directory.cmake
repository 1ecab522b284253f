# bench_directory: the embedded directory and the etcd one side by side (issue 13): JOIN latency,
# JOIN -> every watcher's event and kill -> FAILED, with 1000 endpoints and 100 watchers.
if(CONNEX_ETCD)
  add_executable(bench_directory ${CMAKE_CURRENT_LIST_DIR}/directory_bench.cc)
  target_link_libraries(bench_directory PRIVATE connex_directory connex_directory_etcd connex_etcd connex_etcd_testing
                        connex_cli)
endif()
