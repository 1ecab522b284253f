# connex-chaos (label chaos): a short run of every campaign on a real deployment, asserting
# correctness (0 mismatched tokens, no lost request with the proxy, no step run by a fenced
# process), never speed; and the tool's own pieces.
connex_test(chaos_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/chaos_test.cc
  LIBS connex_chaos connex_subprocess nlohmann_json::nlohmann_json
  LABELS chaos
  COST 20)
add_dependencies(chaos_test connex-chaos connex-stage connex-proxy connex-directory
                 connex-mkmodel connex-generate)
