// What the tests of EtcdClient share (etcd_client_test.cc, etcd_client_failover_test.cc): the
// EtcdClientTest fixture — a real 3-member etcd cluster per test (testing/etcd_cluster.h), skipped
// where etcd is not installed — and helpers to write a key once and to read and print watch events.
#ifndef CONNEX_DIRECTORY_ETCD_ETCD_CLIENT_TEST_UTIL_H_
#define CONNEX_DIRECTORY_ETCD_ETCD_CLIENT_TEST_UTIL_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {

inline RangeOptions Prefix(std::string_view prefix) {
  RangeOptions options;
  options.range_end = PrefixEnd(prefix);
  return options;
}

// Creates `key` and returns the revision that wrote it — once, even when the client retried a
// write that an attempt it gave up on had applied (EtcdClient's contract: a write that timed out
// on one member may be done; retry-safe writes compare on their own value).
inline absl::StatusOr<int64_t> CreateOnce(EtcdClient& client, const std::string& key,
                                          const std::string& value) {
  CONNEX_ASSIGN_OR_RETURN(
      TxnResult txn,
      client.Transact(Txn{{Compare::Absent(key)}, {TxnOp::Put(key, value)}, {TxnOp::Get(key)}}));
  if (txn.succeeded) return txn.revision;
  if (txn.results.empty() || txn.results[0].range.kvs.empty() ||
      txn.results[0].range.kvs[0].value != value) {
    return absl::AlreadyExistsError(StrCat(key, " exists with another value"));
  }
  return txn.results[0].range.kvs[0].mod_revision;
}

inline std::string Describe(const std::vector<WatchEvent>& events) {
  std::string out;
  for (const WatchEvent& e : events) {
    out += (e.type == WatchEvent::Type::kPut ? " PUT " : " DELETE ") + e.kv.key + "@" +
           std::to_string(e.kv.mod_revision);
  }
  return out;
}

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::EtcdCluster::FindEtcd().empty())
      GTEST_SKIP() << testing::EtcdCluster::kSkipMessage;
    testing::EtcdClusterOptions options;
    options.dir = ::testing::TempDir();
    auto cluster = testing::EtcdCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  std::unique_ptr<EtcdClient> Connect(EtcdClientOptions options = {}) {
    if (options.address.empty()) options.address = cluster_->address();
    auto client = EtcdClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Responses of `watch` until `count` events have come (or 20 s passed: then fewer).
  static std::vector<WatchEvent> Events(EtcdWatch& watch, size_t count) {
    std::vector<WatchEvent> events;
    absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (events.size() < count && absl::Now() < deadline) {
      absl::StatusOr<WatchResponse> response = watch.Next(absl::Seconds(1));
      if (absl::IsDeadlineExceeded(response.status())) continue;
      EXPECT_TRUE(response.ok()) << response.status();
      if (!response.ok()) break;
      for (WatchEvent& event : response->events) events.push_back(std::move(event));
    }
    return events;
  }

  std::unique_ptr<testing::EtcdCluster> cluster_;
};

}  // namespace connex::directory::etcd

#endif  // CONNEX_DIRECTORY_ETCD_ETCD_CLIENT_TEST_UTIL_H_
