# Runs the engine's binaries (connex-mkmodel, connex-generate) as a user would.
connex_test(engine_cli_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/engine_cli_test.cc
  LIBS connex_base nlohmann_json::nlohmann_json
  LABELS engine)
add_dependencies(engine_cli_test connex-mkmodel connex-generate)
