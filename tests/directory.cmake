connex_test(directory_process_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/directory_process_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/directory_process_limits_test.cc
  LIBS connex_subprocess connex_directory nlohmann_json::nlohmann_json
  LABELS directory)
add_dependencies(directory_process_test connex-directory connexctl)
