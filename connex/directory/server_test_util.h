// What the tests of DirectoryServer with DirectoryClient share (server_test.cc,
// server_recovery_test.cc, server_junk_test.cc): a log of delivered events and the DirectoryTest
// fixture — a server on free loopback ports (kept across a restart), clients and watchers of it.
#ifndef CONNEX_DIRECTORY_SERVER_TEST_UTIL_H_
#define CONNEX_DIRECTORY_SERVER_TEST_UTIL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "gtest/gtest.h"

namespace connex::directory {

class EventLog {
 public:
  void Add(const Event& e) {
    connex::MutexLock lock(&mu_);
    events_.push_back(e);
  }
  bool Has(EventKind kind, const Lid& lid, uint64_t epoch = 0) const {
    connex::MutexLock lock(&mu_);
    for (const Event& e : events_) {
      if (e.kind == kind && e.record.lid == lid && (epoch == 0 || e.record.epoch == epoch))
        return true;
    }
    return false;
  }
  std::vector<Event> All() const {
    connex::MutexLock lock(&mu_);
    return events_;
  }

 private:
  mutable connex::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

class DirectoryTest : public ::testing::Test {
 protected:
  void StartServer(DirectoryServerOptions options = {}) {
    options.bind = bind_.empty() ? "tcp://127.0.0.1:0" : bind_;
    options.pub = pub_.empty() ? "tcp://127.0.0.1:0" : pub_;
    if (options.lease_ttl_ms == 3000) options.lease_ttl_ms = 1000;
    if (options.heartbeat_ms == 1000) options.heartbeat_ms = 100;
    options.tick_ms = 50;
    auto server = DirectoryServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    bind_ = server_->bind_address();
    pub_ = server_->pub_address();
  }

  std::unique_ptr<DirectoryClient> Client(std::string token = "", std::string admin_token = "") {
    DirectoryClientOptions options;
    options.directory = bind_;
    options.token = std::move(token);
    options.admin_token = std::move(admin_token);
    options.request_timeout_ms = 2000;
    auto client = DirectoryClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<DirectoryClient> Watcher(EventLog* log) {
    auto w = Client();
    w->Subscribe([log](const Event& e) { log->Add(e); });
    EXPECT_TRUE(w->Watch("demo").ok());
    return w;
  }

  std::unique_ptr<DirectoryServer> server_;
  std::string bind_, pub_;
  const Lid a_{"demo", 1, 0, 0};
  const Lid b_{"demo", 1, 0, 1};
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_SERVER_TEST_UTIL_H_
