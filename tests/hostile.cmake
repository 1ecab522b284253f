# The hostile run (label `hostile`, issue 23): what a hostile client or a stranger tried, each a
# regression test that prints its figure — orphaned requests, slowloris, held bodies, forged
# PINGs and RELEASEs and the sockets they cost, a stranger's JOIN and reports, a lost snapshot
# across a directory restart. The same tests run under their own labels too; this label runs
# them together (`ctest -L hostile`), as CI does in `make test`.
set(connex_hostile_runs
  "connex_serving_test|HttpServerTest.AClientThatSendsMoreThanAHeadersWorth*:HttpServerTest.SlowClientsCannotHoldEverySlot:HttpServerTest.RequestBodiesHeldAtOnceAreBounded:HttpServerTest.InlineRoutesAnswerWhileEveryHandlerThreadIsBusy:HttpServerTest.ABodyInAContentEncodingIsRefusedWith415"
  "connex_pp_test|RobustnessTest.PingsAndReleasesAreAnsweredOnlyAtAMembersOwnAddress:ZmqSignalTest.SocketsKeptForDestinationsAreBounded:RobustnessTest.ForgedResultsAndReleasesAreDropped"
  "connex_directory_test|RegistryTest.AMembersReportsAreScopedToItsPeerGroupsAndRateLimited:RegistryTest.ReportFailedFromAStrangerIsRefused:DirectoryTest.ASnapshotLostAcrossARestartIsAskedAgainAtOnce"
  "directory_process_test|SecureByDefaultTest.*:LimitedDirectoryTest.AConnectionStormsMemoryIsGivenBack:LimitedDirectoryTest.AFloodOfOversizedJunkDelaysNobody"
  "serving_e2e_hostile_test|ServingE2eTest.*")
foreach(run ${connex_hostile_runs})
  string(REPLACE "|" ";" parts "${run}")
  list(GET parts 0 binary)
  list(GET parts 1 filter)
  # A target name in COMMAND is resolved when the build files are generated, so the binaries of
  # fragments included after this one are found too.
  add_test(NAME hostile_${binary} COMMAND ${binary} --gtest_filter=${filter})
  set_tests_properties(hostile_${binary} PROPERTIES LABELS hostile
                       ENVIRONMENT "CONNEX_BIN_DIR=${CMAKE_BINARY_DIR}/bin" TIMEOUT 600)
endforeach()
