add_executable(pp_test_node ${CMAKE_CURRENT_LIST_DIR}/pp_node_main.cc)
target_link_libraries(pp_test_node PRIVATE connex_pp_testing connex_directory_etcd connex_engine connex_cli
                      nlohmann_json::nlohmann_json)
connex_cold_code(pp_test_node)

connex_test(pp_process_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/pp_process_test.cc
  LIBS connex_subprocess connex_pp_testing connex_engine nlohmann_json::nlohmann_json
  LABELS pp)
add_dependencies(pp_process_test pp_test_node connex-directory connex-mkmodel)

# The example must keep working: run it as a test over each same-host backend.
foreach(backend tcp shm)
  add_test(NAME two_stage_pipeline_${backend} COMMAND two_stage_pipeline --backend ${backend})
  set_tests_properties(two_stage_pipeline_${backend} PROPERTIES LABELS pp TIMEOUT 60)
endforeach()
add_test(NAME mobile_endpoints_example COMMAND mobile_endpoints)
set_tests_properties(mobile_endpoints_example PROPERTIES LABELS elastic TIMEOUT 60)
connex_test_needs(pp two_stage_pipeline)
connex_test_needs(elastic mobile_endpoints)

if(CONNEX_ETCD)
  # The same with the etcd directory (issue 13): label etcd, so that TSan (whose labels do not
  # include etcd) never runs the uninstrumented gRPC under it.
  connex_test(pp_etcd_process_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/pp_etcd_process_test.cc
    LIBS connex_subprocess connex_pp_testing connex_etcd_testing connex_directory_etcd
         nlohmann_json::nlohmann_json
    LABELS etcd)
  add_dependencies(pp_etcd_process_test pp_test_node)
endif()
