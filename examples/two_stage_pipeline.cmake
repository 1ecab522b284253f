add_executable(two_stage_pipeline ${CMAKE_CURRENT_LIST_DIR}/two_stage_pipeline.cc)
target_link_libraries(two_stage_pipeline PRIVATE connex_pp CLI11::CLI11)
