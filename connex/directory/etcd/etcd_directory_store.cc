// The etcd store of DirectoryClient (internal/store.h) for `etcd://` addresses: the membership
// transactions on an EtcdStore (one etcd lease for the process, kept alive by etcd's keepalive;
// a renewal is a check that the record is still this epoch's under that lease), and one
// EtcdModelWatch per watched model feeding the shared view. docs/design/etcd.md describes the
// keys and events; the lease keeper, the view and delivery are the shared client's.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"
#include "connex/directory/etcd/etcd_backend.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/etcd_store.h"
#include "connex/directory/etcd/model_watch.h"
#include "connex/directory/internal/store.h"

namespace connex::directory {
namespace {

using etcd::EtcdClient;
using etcd::EtcdModelWatch;
using etcd::EtcdStore;
using internal::DirectoryStore;
using internal::Held;
using internal::Renewal;
using internal::WatchSink;

int64_t SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class EtcdDirectoryStore final : public DirectoryStore {
 public:
  EtcdDirectoryStore(DirectoryClientOptions options, std::unique_ptr<EtcdClient> client,
                     WatchSink* sink)
      : options_(std::move(options)), client_(std::move(client)), sink_(sink) {}

  ~EtcdDirectoryStore() override {
    std::map<std::string, std::unique_ptr<EtcdModelWatch>> watches;
    std::vector<std::unique_ptr<EtcdModelWatch>> retired;
    std::shared_ptr<EtcdStore> store;
    {
      MutexLock lock(&mu_);
      watches.swap(watches_);
      retired.swap(retired_);
      store.swap(store_);
    }
    // Every watch thread stopped before the members its callbacks use go.
    watches.clear();
    retired.clear();
    store.reset();  // revokes the lease: every LID still held goes (FAILED), as after a crash
  }

  int64_t lease_ttl_ms() const override {
    MutexLock lock(&mu_);
    return store_ ? store_->lease_ttl_ms() : options_.etcd.lease_ttl_ms;
  }
  int64_t advised_heartbeat_ms() const override { return options_.etcd.lease_ttl_ms / 3; }

  // ---- transactions ----

  absl::StatusOr<Registry::JoinResult> Join(const Lid& lid,
                                            const std::vector<std::string>& addresses,
                                            const std::map<std::string, std::string>& metadata,
                                            const JoinAuth& auth) override {
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<EtcdStore> store, Store());
    // A lease lost in an outage longer than its TTL is granted anew before joining again.
    CONNEX_RETURN_IF_ERROR(store->RenewLease());
    return store->Join(lid, addresses, metadata, auth);
  }

  absl::Status Leave(const Lid& lid, uint64_t epoch, const Caller& caller) override {
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<EtcdStore> store, Store());
    return store->Leave(lid, epoch, caller);
  }

  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller) override {
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<EtcdStore> store, Store());
    return store->ReportFailed(lid, epoch, caller);
  }

  absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model,
                                       std::optional<uint32_t> group) override {
    return etcd::ReadSnapshot(*client_, std::move(model), group);
  }

  // ---- the lease: the process's, kept alive by etcd's keepalive; each epoch confirmed ----

  std::vector<absl::StatusOr<Renewal>> Renew(const std::vector<Held>& held,
                                             int64_t /*timeout_ms: etcd's call timeout*/) override {
    std::shared_ptr<EtcdStore> store;
    {
      MutexLock lock(&mu_);
      store = store_;
    }
    std::vector<absl::StatusOr<Renewal>> out;
    const bool lease_lost = store && absl::IsNotFound(store->lease_status());
    for (const Held& h : held) {
      absl::Status confirmed =
          !store       ? absl::FailedPreconditionError("this client never joined")
          : lease_lost ? absl::NotFoundError(StrCat("epoch ", h.epoch, " of ", h.lid.ToString(),
                                                    " is over: this process's etcd lease expired"))
                       : store->Confirm(h.lid, h.epoch);
      if (confirmed.ok()) {
        out.push_back(Renewal{h.epoch, ""});
      } else {
        out.push_back(confirmed);
      }
    }
    return out;
  }

  // Every LID lives as long as the process's lease: etcd expires it a TTL after the renewal it
  // last acknowledged, however recently the record was confirmed.
  std::optional<int64_t> LeaseLeftMs(int64_t /*renewal_age_ms*/) const override {
    std::shared_ptr<EtcdStore> store;
    {
      MutexLock lock(&mu_);
      store = store_;
    }
    if (!store || !store->lease_status().ok()) return std::nullopt;
    std::optional<int64_t> renewed = store->lease_renewed_steady_ms();
    if (!renewed) return std::nullopt;
    return store->lease_ttl_ms() - (SteadyNowMs() - *renewed);
  }

  // ---- the watch: one EtcdModelWatch per scope ----

  absl::Status Watch(const std::string& model) override {
    {
      MutexLock lock(&mu_);
      if (watches_.count("") || watches_.count(model)) return absl::OkStatus();
    }
    uint64_t generation = 0;
    std::map<std::string, uint64_t> before;
    {
      MutexLock lock(&forward_mu_);
      generation = ++generations_;
      before = live_;
      // A watch of every model replaces the per-model ones: theirs forward nothing more (its
      // first snapshot covers whatever they would have).
      if (model.empty()) live_.clear();
      live_[model] = generation;
    }
    absl::StatusOr<std::unique_ptr<EtcdModelWatch>> watch = EtcdModelWatch::Start(
        client_.get(), model,
        [this, model, generation](const Event& e) {
          events_received_.fetch_add(1);
          if (drop_events_.load() > 0) {
            // A lost event: the view misses it until the fresh snapshot that Resync asks for.
            drop_events_.fetch_sub(1);
            Resync(model);
            return;
          }
          MutexLock lock(&forward_mu_);
          if (Live(model, generation)) sink_->OnEvent(e);
        },
        [this, model, generation](const Snapshot& snapshot) {
          MutexLock lock(&forward_mu_);
          if (Live(model, generation)) sink_->OnSnapshot(model, snapshot);
        });
    if (!watch.ok()) {
      MutexLock lock(&forward_mu_);
      live_ = std::move(before);
      return watch.status();
    }
    MutexLock lock(&mu_);
    if (model.empty()) {
      for (auto& [name, replaced] : watches_) retired_.push_back(std::move(replaced));
      watches_.clear();
    }
    watches_[model] = *std::move(watch);
    return absl::OkStatus();
  }

  uint64_t view_revision() const override {
    MutexLock lock(&mu_);
    uint64_t revision = 0;
    for (const auto& [model, watch] : watches_) revision = std::max(revision, watch->revision());
    return revision;
  }
  uint64_t events_received() const override { return events_received_.load(); }
  void DropEventsForTest(int n) override { drop_events_.fetch_add(n); }
  const std::string& pub_address() const override { return no_pub_; }

 private:
  // The store (and with it the process's etcd lease), made on first use: a client that only
  // watches holds no lease.
  absl::StatusOr<std::shared_ptr<EtcdStore>> Store() {
    MutexLock lock(&mu_);
    if (store_) return store_;
    etcd::EtcdStoreOptions options;
    options.lease_ttl_ms = options_.etcd.lease_ttl_ms;
    options.admin_token = options_.admin_token;
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<EtcdStore> store,
                            EtcdStore::Open(client_.get(), std::move(options)));
    store_ = std::move(store);
    return store_;
  }

  bool Live(const std::string& model, uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(forward_mu_) {
    auto it = live_.find(model);
    return it != live_.end() && it->second == generation;
  }

  // On the watch's own thread: it then ends its etcd watch and takes a fresh snapshot.
  void Resync(const std::string& model) {
    MutexLock lock(&mu_);
    auto it = watches_.find(model);
    if (it != watches_.end()) it->second->Resync();
  }

  const DirectoryClientOptions options_;
  const std::unique_ptr<EtcdClient> client_;
  WatchSink* const sink_;
  const std::string no_pub_;
  std::atomic<uint64_t> events_received_{0};
  std::atomic<int> drop_events_{0};

  mutable Mutex mu_;
  std::shared_ptr<EtcdStore> store_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<EtcdModelWatch>> watches_ ABSL_GUARDED_BY(mu_);
  // Watches replaced by a watch of every model; stopped with the store (a callback of theirs
  // may be running while they are replaced).
  std::vector<std::unique_ptr<EtcdModelWatch>> retired_ ABSL_GUARDED_BY(mu_);

  // Held while a watch forwards to the sink: one at a time, and never a replaced watch's.
  Mutex forward_mu_;
  std::map<std::string, uint64_t> live_ ABSL_GUARDED_BY(forward_mu_);  // scope -> generation
  uint64_t generations_ ABSL_GUARDED_BY(forward_mu_) = 0;
};

absl::StatusOr<std::unique_ptr<DirectoryStore>> OpenEtcdStore(const DirectoryClientOptions& options,
                                                              WatchSink* sink) {
  etcd::EtcdClientOptions etcd_options;
  etcd_options.address = options.directory;
  // A request's deadline spans every member and an election (1-4 s): never under etcd's default.
  etcd_options.call_timeout =
      std::max(etcd_options.call_timeout, absl::Milliseconds(options.request_timeout_ms));
  etcd_options.user = options.etcd.user;
  etcd_options.password = options.etcd.password;
  etcd_options.tls.ca_file = options.etcd.ca_file;
  etcd_options.tls.cert_file = options.etcd.cert_file;
  etcd_options.tls.key_file = options.etcd.key_file;
  etcd_options.attempt_timeout = absl::Milliseconds(options.etcd.attempt_timeout_ms);
  etcd_options.watch_probe_interval = absl::Milliseconds(options.etcd.watch_probe_ms);
  if (options.heartbeat_ms > 0) {
    CONNEX_RETURN_IF_ERROR(ValidateLeaseSettings(options.etcd.lease_ttl_ms, options.heartbeat_ms));
  }
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Connect(etcd_options));
  // Like the embedded directory's HELLO: an etcd that does not answer is an error at once.
  etcd::RangeOptions probe;
  probe.count_only = true;
  absl::StatusOr<etcd::RangeResult> hello = client->Range(std::string(etcd::kRoot), probe);
  if (!hello.ok()) {
    return Annotate(hello.status(), StrCat("directory ", options.directory));
  }
  return std::make_unique<EtcdDirectoryStore>(options, std::move(client), sink);
}

}  // namespace

void RegisterEtcdBackend() { internal::RegisterStore("etcd", OpenEtcdStore); }

}  // namespace connex::directory
