add_executable(mobile_endpoints ${CMAKE_CURRENT_LIST_DIR}/mobile_endpoints.cc)
target_link_libraries(mobile_endpoints PRIVATE connex_elastic CLI11::CLI11)
