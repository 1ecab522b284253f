// bench_directory: the embedded directory and the etcd one side by side (issue 13) — JOIN
// latency, JOIN -> every watcher's JOINED event, and a killed holder -> every watcher's FAILED,
// with N endpoints registered by a few holder processes and W watchers of their model. Holders
// and watchers live in this process, each with its own connection (a DirectoryClient, or an
// EtcdStore / EtcdModelWatch on its own EtcdClient), as separate processes would have.
//
//   bench_directory [--backend both|embedded|etcd] [--endpoints 1000] [--watchers 100]
//                   [--holders 10] [--lease-ttl-ms 3000] [--etcd etcd://H:P,...]
//
// Without --etcd, a 3-member etcd cluster is started on free loopback ports (Debian's etcd-server)
// and removed afterwards.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/cli.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/stats.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"
#include "connex/directory/etcd/etcd_backend.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/etcd_store.h"
#include "connex/directory/etcd/model_watch.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "connex/directory/server.h"

namespace {

using connex::Lid;
using connex::StrCat;
using connex::directory::Event;
using connex::directory::EventKind;
using Clock = std::chrono::steady_clock;

constexpr char kModel[] = "bench";

double MsSince(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// When each watcher saw each LID's JOINED and FAILED (the first time).
class Arrivals {
 public:
  void Saw(int watcher, const Event& e) {
    const auto now = Clock::now();
    connex::MutexLock lock(&mu_);
    auto& seen = e.kind == EventKind::kJoined ? joined_ : failed_;
    if (e.kind != EventKind::kJoined && e.kind != EventKind::kFailed) return;
    seen.emplace(std::make_pair(watcher, e.record.lid), now);
  }
  size_t joined() const {
    connex::MutexLock lock(&mu_);
    return joined_.size();
  }
  size_t failed() const {
    connex::MutexLock lock(&mu_);
    return failed_.size();
  }
  // Latencies (ms) from `start[lid]` to each watcher's arrival of that LID's event.
  std::vector<double> Since(const std::map<Lid, Clock::time_point>& start, bool joined) const {
    connex::MutexLock lock(&mu_);
    std::vector<double> out;
    for (const auto& [key, at] : joined ? joined_ : failed_) {
      auto it = start.find(key.second);
      if (it != start.end()) out.push_back(MsSince(it->second, at));
    }
    return out;
  }

 private:
  mutable connex::Mutex mu_;
  std::map<std::pair<int, Lid>, Clock::time_point> joined_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, Lid>, Clock::time_point> failed_ ABSL_GUARDED_BY(mu_);
};

// One backend: holders that join LIDs and can be killed, and watchers.
class Backend {
 public:
  virtual ~Backend() = default;
  // Where the watchers record what they saw: a member of the base, so that it outlives the
  // watchers (the derived class's members) that call into it.
  Arrivals& arrivals() { return arrivals_; }
  virtual std::string name() const = 0;
  virtual absl::Status AddHolder() = 0;
  virtual absl::Status Join(int holder, const Lid& lid) = 0;
  // Holder `holder` stops renewing (as a killed process).
  virtual void Kill(int holder) = 0;
  virtual absl::Status AddWatcher(int index, Arrivals* arrivals) = 0;

 private:
  Arrivals arrivals_;
};

class EmbeddedBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<EmbeddedBackend>> Start(int64_t lease_ttl_ms,
                                                                size_t endpoints) {
    connex::directory::DirectoryServerOptions options;
    options.bind = "tcp://127.0.0.1:0";
    options.pub = "tcp://127.0.0.1:0";
    options.lease_ttl_ms = lease_ttl_ms;
    options.heartbeat_ms = lease_ttl_ms / 3;
    options.max_records_per_model =
        std::max(endpoints, connex::directory::kDefaultMaxRecordsPerModel);
    options.max_records = std::max(endpoints, connex::directory::kDefaultMaxRecords);
    auto b = std::make_unique<EmbeddedBackend>();
    CONNEX_ASSIGN_OR_RETURN(b->server_, connex::directory::DirectoryServer::Start(options));
    return b;
  }
  std::string name() const override { return "embedded"; }
  absl::Status AddHolder() override {
    CONNEX_ASSIGN_OR_RETURN(auto client, Connect());
    holders_.push_back(std::move(client));
    return absl::OkStatus();
  }
  absl::Status Join(int holder, const Lid& lid) override {
    return holders_[holder]->Join(lid, {"tcp://127.0.0.1:1"}).status();
  }
  void Kill(int holder) override { holders_[holder].reset(); }
  absl::Status AddWatcher(int index, Arrivals* arrivals) override {
    CONNEX_ASSIGN_OR_RETURN(auto client, Connect());
    client->Subscribe([arrivals, index](const Event& e) { arrivals->Saw(index, e); });
    CONNEX_RETURN_IF_ERROR(client->Watch(kModel));
    watchers_.push_back(std::move(client));
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::unique_ptr<connex::directory::DirectoryClient>> Connect() {
    connex::directory::DirectoryClientOptions options;
    options.directory = server_->bind_address();
    options.request_timeout_ms = 10000;
    return connex::directory::DirectoryClient::Connect(options);
  }
  std::unique_ptr<connex::directory::DirectoryServer> server_;
  std::vector<std::unique_ptr<connex::directory::DirectoryClient>> holders_;
  std::vector<std::unique_ptr<connex::directory::DirectoryClient>> watchers_;
};

class EtcdBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdBackend>> Start(std::string address,
                                                            int64_t lease_ttl_ms,
                                                            size_t endpoints) {
    auto b = std::make_unique<EtcdBackend>();
    if (address.empty()) {
      connex::directory::etcd::testing::EtcdClusterOptions options;
      b->dir_ = StrCat("/tmp/bench_directory.", getpid());
      options.dir = b->dir_;
      CONNEX_ASSIGN_OR_RETURN(b->cluster_,
                              connex::directory::etcd::testing::EtcdCluster::Start(options));
      address = b->cluster_->address();
    }
    b->address_ = address;
    b->lease_ttl_ms_ = lease_ttl_ms;
    b->endpoints_ = endpoints;
    // A fresh model: what an earlier run left in a given cluster goes first.
    CONNEX_ASSIGN_OR_RETURN(auto admin, b->Connect());
    std::string prefix = connex::directory::etcd::ModelPrefix(kModel);
    CONNEX_RETURN_IF_ERROR(
        admin->DeleteRange(prefix, connex::directory::etcd::PrefixEnd(prefix)).status());
    return b;
  }
  ~EtcdBackend() override {
    watchers_.clear();
    stores_.clear();
    clients_.clear();
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string name() const override { return "etcd"; }
  absl::Status AddHolder() override {
    CONNEX_ASSIGN_OR_RETURN(auto client, Connect());
    connex::directory::etcd::EtcdStoreOptions options;
    options.lease_ttl_ms = lease_ttl_ms_;
    options.max_records_per_model = endpoints_;
    CONNEX_ASSIGN_OR_RETURN(auto store,
                            connex::directory::etcd::EtcdStore::Open(client.get(), options));
    clients_.push_back(std::move(client));
    stores_.push_back(std::move(store));
    return absl::OkStatus();
  }
  absl::Status Join(int holder, const Lid& lid) override {
    return stores_[holder]->Join(lid, {"tcp://127.0.0.1:1"}, {}).status();
  }
  void Kill(int holder) override { stores_[holder]->StopRenewingForTest(); }
  absl::Status AddWatcher(int index, Arrivals* arrivals) override {
    CONNEX_ASSIGN_OR_RETURN(auto client, Connect());
    CONNEX_ASSIGN_OR_RETURN(
        auto watch,
        connex::directory::etcd::EtcdModelWatch::Start(
            client.get(), kModel, [arrivals, index](const Event& e) { arrivals->Saw(index, e); }));
    clients_.push_back(std::move(client));
    watchers_.push_back(std::move(watch));
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::unique_ptr<connex::directory::etcd::EtcdClient>> Connect() {
    connex::directory::etcd::EtcdClientOptions options;
    options.address = address_;
    return connex::directory::etcd::EtcdClient::Connect(options);
  }
  std::string dir_;
  std::unique_ptr<connex::directory::etcd::testing::EtcdCluster> cluster_;
  std::string address_;
  int64_t lease_ttl_ms_ = 3000;
  size_t endpoints_ = 0;
  // Destroyed in this order: watches and stores before the clients they use.
  std::vector<std::unique_ptr<connex::directory::etcd::EtcdClient>> clients_;
  std::vector<std::unique_ptr<connex::directory::etcd::EtcdStore>> stores_;
  std::vector<std::unique_ptr<connex::directory::etcd::EtcdModelWatch>> watchers_;
};

bool WaitFor(const std::function<bool()>& done, int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

struct Row {
  std::string backend;
  double join_p50 = 0, join_p99 = 0;
  double event_p50 = 0, event_p99 = 0;
  double failed_p50 = 0, failed_p99 = 0;
  size_t failed_lids = 0;
};

absl::StatusOr<Row> Run(Backend& backend, int endpoints, int watchers, int holders,
                        int64_t lease_ttl_ms) {
  Arrivals& arrivals = backend.arrivals();
  for (int h = 0; h < holders; ++h) CONNEX_RETURN_IF_ERROR(backend.AddHolder());
  for (int w = 0; w < watchers; ++w) CONNEX_RETURN_IF_ERROR(backend.AddWatcher(w, &arrivals));
  // Each holder joins its share of the LIDs one after another, the holders at once.
  std::map<Lid, Clock::time_point> joined_at;
  std::vector<double> join_ms;
  connex::Mutex mu;
  absl::Status failure;
  std::vector<std::thread> threads;
  for (int h = 0; h < holders; ++h) {
    threads.emplace_back([&, h] {
      for (int i = h; i < endpoints; i += holders) {
        Lid lid{kModel, static_cast<uint32_t>(1 + i / 256), 0, static_cast<uint32_t>(i % 256)};
        const auto start = Clock::now();
        absl::Status s = backend.Join(h, lid);
        const auto end = Clock::now();
        connex::MutexLock lock(&mu);
        if (!s.ok()) {
          failure = connex::Annotate(s, StrCat("JOIN of ", lid.ToString()));
          return;
        }
        joined_at[lid] = start;
        join_ms.push_back(MsSince(start, end));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CONNEX_RETURN_IF_ERROR(failure);
  const size_t expected = static_cast<size_t>(endpoints) * watchers;
  if (!WaitFor([&] { return arrivals.joined() >= expected; }, 60000)) {
    return absl::DeadlineExceededError(
        StrCat("watchers saw ", arrivals.joined(), " of ", expected, " JOINED events within 60 s"));
  }
  Row row;
  row.backend = backend.name();
  row.join_p50 = connex::Percentile(join_ms, 0.5);
  row.join_p99 = connex::Percentile(join_ms, 0.99);
  std::vector<double> to_event = arrivals.Since(joined_at, /*joined=*/true);
  row.event_p50 = connex::Percentile(to_event, 0.5);
  row.event_p99 = connex::Percentile(to_event, 0.99);
  // Holder 0 dies: every watcher must see FAILED for each of its LIDs.
  std::map<Lid, Clock::time_point> killed_at;
  const auto kill = Clock::now();
  for (int i = 0; i < endpoints; i += holders) {
    killed_at[Lid{kModel, static_cast<uint32_t>(1 + i / 256), 0, static_cast<uint32_t>(i % 256)}] =
        kill;
  }
  backend.Kill(0);
  const size_t expected_failed = killed_at.size() * watchers;
  if (!WaitFor([&] { return arrivals.failed() >= expected_failed; }, 10 * lease_ttl_ms + 30000)) {
    return absl::DeadlineExceededError(
        StrCat("watchers saw ", arrivals.failed(), " of ", expected_failed, " FAILED events"));
  }
  std::vector<double> to_failed = arrivals.Since(killed_at, /*joined=*/false);
  row.failed_p50 = connex::Percentile(to_failed, 0.5);
  row.failed_p99 = connex::Percentile(to_failed, 0.99);
  row.failed_lids = killed_at.size();
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  connex::directory::RegisterEtcdBackend();
  connex::cli::App app{"Connex directory: the embedded directory and etcd side by side"};
  std::string backend = "both";
  int endpoints = 1000;
  int watchers = 100;
  int holders = 10;
  int64_t lease_ttl_ms = 3000;
  std::string etcd;
  app.add_option("--backend", backend, "which directories to measure")
      ->check(connex::cli::IsMember({"both", "embedded", "etcd"}));
  app.add_option("--endpoints", endpoints, "LIDs registered")->check(connex::cli::Range(1, 1024));
  app.add_option("--watchers", watchers, "watchers of their model")
      ->check(connex::cli::Range(1, 1000));
  app.add_option("--holders", holders, "holder processes the LIDs are spread over")
      ->check(connex::cli::Range(1, 1000));
  app.add_option("--lease-ttl-ms", lease_ttl_ms, "lease TTL of the holders")
      ->check(connex::cli::Range(1000, 60000));
  app.add_option("--etcd", etcd,
                 "etcd://H:P,... of a running cluster (default: start a 3-member one)");
  connex::AddLogLevelFlag(app, "warn");
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv)) return *code;
  if (holders > endpoints) holders = endpoints;

  std::vector<Row> rows;
  for (std::string name : {"embedded", "etcd"}) {
    if (backend != "both" && backend != name) continue;
    std::cerr << "bench_directory: " << name << ": " << endpoints << " endpoints from " << holders
              << " holders, " << watchers << " watchers\n";
    absl::StatusOr<Row> row;
    if (name == "embedded") {
      auto b = EmbeddedBackend::Start(lease_ttl_ms, static_cast<size_t>(endpoints));
      row = b.ok() ? Run(**b, endpoints, watchers, holders, lease_ttl_ms)
                   : absl::StatusOr<Row>(b.status());
    } else {
      auto b = EtcdBackend::Start(etcd, lease_ttl_ms, static_cast<size_t>(endpoints));
      row = b.ok() ? Run(**b, endpoints, watchers, holders, lease_ttl_ms)
                   : absl::StatusOr<Row>(b.status());
    }
    if (!row.ok()) {
      std::cerr << "bench_directory: " << name << ": " << row.status() << "\n";
      return 1;
    }
    rows.push_back(*row);
  }
  std::printf("%d endpoints (%d holders), %d watchers, lease TTL %lld ms\n", endpoints, holders,
              watchers, static_cast<long long>(lease_ttl_ms));
  std::printf("%-9s %12s %12s %16s %16s %16s %16s\n", "backend", "JOIN p50 ms", "JOIN p99 ms",
              "JOIN->event p50", "JOIN->event p99", "kill->FAILED p50", "kill->FAILED p99");
  for (const Row& r : rows) {
    std::printf("%-9s %12.2f %12.2f %16.2f %16.2f %16.0f %16.0f\n", r.backend.c_str(), r.join_p50,
                r.join_p99, r.event_p50, r.event_p99, r.failed_p50, r.failed_p99);
  }
  return 0;
}
