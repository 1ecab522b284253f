# Several hosts (label hosts): network-namespace hosts on a bridge (connex/chaos/hosts.h), the
# deploy/systemd units started as written on them, and a deployment across them with faults. As
# root only (each test skips with the reason otherwise).
pkg_check_modules(NFQUEUE QUIET IMPORTED_TARGET libnetfilter_queue)
if(NFQUEUE_FOUND)
  # connex-netdelay: the delaying relay behind Hosts::SetDelay.
  add_executable(connex-netdelay ${CMAKE_CURRENT_LIST_DIR}/netdelay_main.cc)
  target_link_libraries(connex-netdelay PRIVATE PkgConfig::NFQUEUE)
  connex_test_needs(hosts connex-netdelay)
else()
  message(STATUS "libnetfilter-queue-dev not found: no connex-netdelay (the hosts tests of "
                 "latency skip); scripts/install-deps.sh installs it")
endif()
connex_test(hosts_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/hosts_test.cc
  LIBS connex_chaos connex_subprocess
  LABELS hosts)
# deploy/systemd's units, started as written on namespace hosts. Their addresses are fixed
# (10.77.0.x, the units'), so its tests never run at the same time (RESOURCE_LOCK).
if(CONNEX_BUILD_TESTS)
  add_executable(deploy_systemd_test ${CMAKE_CURRENT_LIST_DIR}/deploy_systemd_test.cc
                 ${CMAKE_CURRENT_LIST_DIR}/systemd_unit.cc)
  target_link_libraries(deploy_systemd_test PRIVATE connex_chaos connex_subprocess
                        nlohmann_json::nlohmann_json GTest::gmock GTest::gtest_main)
  target_compile_definitions(deploy_systemd_test PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  connex_cold_code(deploy_systemd_test)
  gtest_discover_tests(deploy_systemd_test DISCOVERY_TIMEOUT 60
                       PROPERTIES ENVIRONMENT "CONNEX_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                                  LABELS hosts RESOURCE_LOCK connex-hosts-subnet-0)
  connex_test_needs(hosts deploy_systemd_test connex-directory connex-stage connex-proxy connexctl
                    connex-generate connex-mkmodel)
endif()
# A deployment across namespace hosts (etcd with TLS, CURVE, two chains spread over hosts, the
# proxy alone) under faults across hosts: exact tokens through the proxy, figures printed.
# RUN_SERIAL: four deployments at once on a small machine would starve their leases.
if(CONNEX_BUILD_TESTS)
  add_executable(multihost_test ${CMAKE_CURRENT_LIST_DIR}/multihost_test.cc
                 ${CMAKE_CURRENT_LIST_DIR}/multihost_deployment.cc)
  target_link_libraries(multihost_test PRIVATE connex_chaos connex_subprocess
                        nlohmann_json::nlohmann_json GTest::gmock GTest::gtest_main)
  connex_cold_code(multihost_test)
  gtest_discover_tests(multihost_test DISCOVERY_TIMEOUT 60
                       PROPERTIES ENVIRONMENT "CONNEX_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                                  LABELS hosts RUN_SERIAL TRUE)
  connex_test_needs(hosts multihost_test)
  if(CONNEX_ETCD)
    connex_test_needs(hosts connex_etcd_plugin)  # the stages' and the proxy's etcd://
  endif()
endif()
# deploy/k8s: every container command's flags against the binary's --help.
connex_test(deploy_k8s_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/deploy_k8s_test.cc
  LIBS connex_subprocess nlohmann_json::nlohmann_json
  LABELS hosts)
if(TARGET deploy_k8s_test)
  target_compile_definitions(deploy_k8s_test PRIVATE CONNEX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  connex_test_needs(hosts connex-mkmodel)
endif()
