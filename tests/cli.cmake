# Every binary run with bad flags (exit 2 and a message naming the flag), and every flag of every
# binary checked against docs/configuration.md.
connex_test(cli_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cli_test.cc
  LIBS connex_subprocess
  LABELS cli)
# What it checks depends on what this build has (CONNEX_BUILD_BENCHMARKS, CONNEX_ETCD).
set(have_benchmarks 0)
set(have_etcd 0)
if(CONNEX_BUILD_BENCHMARKS)
  set(have_benchmarks 1)
endif()
if(CONNEX_ETCD)
  set(have_etcd 1)
endif()
target_compile_definitions(cli_test PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                            CONNEX_VERSION="${PROJECT_VERSION}"
                                            CONNEX_HAVE_BENCHMARKS=${have_benchmarks}
                                            CONNEX_HAVE_ETCD=${have_etcd})
add_dependencies(cli_test connex-bench connex-chaos connex-directory connex-generate connex-mkmodel connex-proxy connex-stage
                 connexctl pp_test_node mobile_endpoints two_stage_pipeline)
if(CONNEX_BUILD_BENCHMARKS)
  add_dependencies(cli_test bench_engine bench_handover bench_pp_memory)
  if(CONNEX_ETCD)
    add_dependencies(cli_test bench_directory)
  endif()
endif()
if(CONNEX_ETCD)
  add_dependencies(cli_test connex_etcd_plugin)  # the programs' etcd:// (bin/libconnex-etcd.so)
endif()
