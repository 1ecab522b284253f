// What the tests of EtcdStore against a real cluster share (etcd_store_test.cc,
// etcd_store_recovery_test.cc): the EtcdStoreTest fixture — one 3-member etcd cluster for the
// suite (testing/etcd_cluster.h), each test its own model, skipped where etcd is not installed —
// and a watcher of the model that derives the events every operation must produce.
#ifndef CONNEX_DIRECTORY_ETCD_ETCD_STORE_TEST_UTIL_H_
#define CONNEX_DIRECTORY_ETCD_ETCD_STORE_TEST_UTIL_H_

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/etcd_store.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {

using testing::EtcdCluster;
using testing::EtcdClusterOptions;

class EtcdStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (EtcdCluster::FindEtcd().empty()) return;
    EtcdClusterOptions options;
    options.dir = ::testing::TempDir();
    auto cluster = EtcdCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    if (EtcdCluster::FindEtcd().empty()) GTEST_SKIP() << EtcdCluster::kSkipMessage;
    ASSERT_NE(cluster_, nullptr);
    EtcdClientOptions options;
    options.address = cluster_->address();
    auto client = EtcdClient::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    // Every test its own model, so that one cluster serves the suite.
    model_ = StrCat("m-", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    model_.resize(std::min<size_t>(model_.size(), Lid::kMaxModelLength));
  }

  std::unique_ptr<EtcdStore> Open(EtcdStoreOptions options = {}) {
    if (options.admin_token.empty()) options.admin_token = "admin-secret";
    auto store = EtcdStore::Open(client_.get(), options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  Lid L(uint32_t group, uint32_t replica) const { return Lid{model_, group, 0, replica}; }

  // A watcher of the model from its snapshot on, deriving events.
  struct Watcher {
    std::unique_ptr<EtcdWatch> watch;
    std::unique_ptr<EventDeriver> deriver;
    std::vector<Event> events;
    // Waits until `count` events were derived in all (20 s at most), and returns them.
    const std::vector<Event>& Await(size_t count) {
      absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (events.size() < count && absl::Now() < deadline) {
        absl::StatusOr<WatchResponse> response = watch->Next(absl::Milliseconds(200));
        if (absl::IsDeadlineExceeded(response.status())) continue;
        EXPECT_TRUE(response.ok()) << response.status();
        if (!response.ok()) break;
        for (Event& e : deriver->Apply(*response)) events.push_back(std::move(e));
      }
      return events;
    }
  };
  Watcher Watch(EtcdStore& store) {
    absl::StatusOr<Snapshot> snapshot = store.Snap(model_);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    WatchOptions options;
    options.range_end = PrefixEnd(ModelPrefix(model_));
    options.start_revision = static_cast<int64_t>(snapshot->revision) + 1;
    options.prev_kv = true;
    Watcher watcher;
    watcher.watch = client_->Watch(ModelPrefix(model_), options);
    watcher.deriver = std::make_unique<EventDeriver>(snapshot->revision);
    return watcher;
  }

  static std::string Kinds(const std::vector<Event>& events) {
    std::string out;
    for (const Event& e : events) {
      out += StrCat(out.empty() ? "" : " ", EventKindName(e.kind), ":", e.record.lid.ToString(),
                    "@", e.record.epoch, e.reason.empty() ? "" : StrCat("(", e.reason, ")"));
    }
    return out;
  }

  static inline EtcdCluster* cluster_ = nullptr;
  std::unique_ptr<EtcdClient> client_;
  std::string model_;
};

}  // namespace connex::directory::etcd

#endif  // CONNEX_DIRECTORY_ETCD_ETCD_STORE_TEST_UTIL_H_
