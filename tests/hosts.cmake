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
