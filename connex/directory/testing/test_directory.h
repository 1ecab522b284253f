// Test helpers for the control plane: a directory on free loopback ports with short leases, and
// a client of it. Thread-safe (stateless).
#ifndef CONNEX_DIRECTORY_TESTING_TEST_DIRECTORY_H_
#define CONNEX_DIRECTORY_TESTING_TEST_DIRECTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"

namespace connex::directory::testing {

// The admin token of test directories. ConnectTo's clients carry it, so that a test's sender
// that holds no LID (an ElasticPeerSet owner in a unit test) may still report failures; a
// production sender is a member of its model (it holds its own LID).
inline constexpr char kTestAdminToken[] = "connex-test-admin";

// A directory on 127.0.0.1 at free ports with a `lease_ttl_ms` lease, 100 ms advised heartbeats
// and 50 ms ticks (so that gaps are found fast), and kTestAdminToken.
inline absl::StatusOr<std::unique_ptr<DirectoryServer>> StartTestDirectory(
    int64_t lease_ttl_ms = 1000) {
  DirectoryServerOptions options;
  options.bind = "tcp://127.0.0.1:0";
  options.pub = "tcp://127.0.0.1:0";
  options.lease_ttl_ms = lease_ttl_ms;
  options.heartbeat_ms = 100;
  options.tick_ms = 50;
  options.admin_token = kTestAdminToken;
  return DirectoryServer::Start(options);
}

// A client of `server` with default options and kTestAdminToken.
inline absl::StatusOr<std::unique_ptr<DirectoryClient>> ConnectTo(const DirectoryServer& server) {
  DirectoryClientOptions options;
  options.directory = server.bind_address();
  options.admin_token = kTestAdminToken;
  return DirectoryClient::Connect(options);
}

}  // namespace connex::directory::testing

#endif  // CONNEX_DIRECTORY_TESTING_TEST_DIRECTORY_H_
