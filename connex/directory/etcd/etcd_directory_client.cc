// The DirectoryClient backend for `etcd://` addresses (internal/client_backend.h): the holder side
// on an EtcdStore (one etcd lease for the process, renewed by etcd's keepalive; each held LID
// confirmed every heartbeat interval, rejoined under a new epoch after an eviction or a lost
// lease, given up when another epoch took it), the watcher side on one EtcdModelWatch per watched
// model. docs/design/etcd.md describes the keys and events.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/secret_file.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/etcd_store.h"
#include "connex/directory/etcd/model_watch.h"
#include "connex/directory/internal/client_backend.h"

namespace connex::directory::internal {
namespace {

using etcd::EtcdClient;
using etcd::EtcdModelWatch;
using etcd::EtcdStore;

// Whether this thread is delivering events (Unsubscribe from a callback must not wait for it).
thread_local bool delivering = false;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class EtcdClientBackend final : public ClientBackend {
 public:
  EtcdClientBackend(DirectoryClientOptions options, std::unique_ptr<EtcdClient> client,
                    int64_t lease_ttl_ms)
      : options_(std::move(options)), client_(std::move(client)), lease_ttl_ms_(lease_ttl_ms) {
    heartbeat_ms_ = options_.heartbeat_ms > 0 ? options_.heartbeat_ms : lease_ttl_ms_ / 3;
    thread_ = std::thread([this] { Maintain(); });
  }

  ~EtcdClientBackend() override {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    std::map<std::string, std::unique_ptr<EtcdModelWatch>> watches;
    std::vector<std::map<std::string, std::unique_ptr<EtcdModelWatch>>> retired;
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

  // ---- holder side ----

  absl::StatusOr<uint64_t> Join(const Lid& lid, std::vector<std::string> addresses,
                                std::map<std::string, std::string> metadata, bool force) override {
    CONNEX_RETURN_IF_ERROR(ValidateRegistration(addresses, metadata));
    if (force && options_.admin_token.empty()) {
      return absl::PermissionDeniedError(
          StrCat("a forced JOIN of ", lid.ToString(),
                 " needs the admin token (CONNEX_DIRECTORY_ADMIN_TOKEN or _FILE)"));
    }
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<EtcdStore> store, Store());
    CONNEX_RETURN_IF_ERROR(store->RenewLease());
    JoinAuth auth;
    {
      MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it != registrations_.end()) auth.credential = it->second.credential;
    }
    auth.force = force;
    auth.admin_token = options_.admin_token;
    // A previous holder that died keeps the LID until its lease runs out: wait that long.
    const int64_t give_up_ms =
        NowMs() + (options_.join_waits_for_lease ? store->lease_ttl_ms() + heartbeat_ms_ : 0);
    while (true) {
      absl::StatusOr<Registry::JoinResult> joined = store->Join(lid, addresses, metadata, auth);
      const int64_t now = NowMs();
      if (absl::IsAlreadyExists(joined.status()) && now < give_up_ms) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min<int64_t>(give_up_ms - now, heartbeat_ms_)));
        continue;
      }
      if (!joined.ok()) return joined.status();
      MutexLock lock(&mu_);
      Registration& r = registrations_[lid];
      r.epoch = joined->epoch;
      r.credential = joined->credential;
      r.addresses = std::move(addresses);
      r.metadata = std::move(metadata);
      r.renewed_ms = now;
      return joined->epoch;
    }
  }

  absl::Status Leave(const Lid& lid) override {
    Registration r;
    std::shared_ptr<EtcdStore> store;
    {
      MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it == registrations_.end()) {
        return absl::NotFoundError(StrCat("this client does not hold ", lid.ToString()));
      }
      r = it->second;
      registrations_.erase(it);
      store = store_;
    }
    Caller caller;
    caller.credential = r.credential;
    absl::Status left = store->Leave(lid, r.epoch, caller);
    // Gone already (evicted, expired, superseded): nothing is left to leave.
    if (absl::IsNotFound(left) || absl::IsFailedPrecondition(left)) return absl::OkStatus();
    return left;
  }

  absl::Status LeaveAll() override {
    std::vector<Lid> lids;
    {
      MutexLock lock(&mu_);
      for (const auto& [lid, r] : registrations_) lids.push_back(lid);
    }
    absl::Status result;
    for (const Lid& lid : lids) result.Update(Leave(lid));
    return result;
  }

  absl::StatusOr<uint64_t> Renew(const Lid& lid) override {
    std::optional<uint64_t> epoch = EpochOf(lid);
    if (!epoch) return absl::NotFoundError(StrCat("this client does not hold ", lid.ToString()));
    absl::Status confirmed = Check(lid, *epoch);
    // Evicted (and joined again, or not) is, to the caller, an epoch the directory no longer holds.
    if (absl::IsNotFound(confirmed)) return absl::FailedPreconditionError(confirmed.message());
    if (!confirmed.ok()) return confirmed;
    return *epoch;
  }

  std::optional<int64_t> RenewalAgeMs(const Lid& lid) const override {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end()) return std::nullopt;
    return NowMs() - it->second.renewed_ms;
  }

  // The LID lives as long as the process's lease: etcd expires it a TTL after the renewal it last
  // acknowledged, however recently the record was read.
  std::optional<int64_t> LeaseLeftMs(const Lid& lid) const override {
    std::shared_ptr<EtcdStore> store;
    {
      MutexLock lock(&mu_);
      if (registrations_.find(lid) == registrations_.end()) return std::nullopt;
      store = store_;
    }
    if (!store || !store->lease_status().ok()) return std::nullopt;
    std::optional<int64_t> renewed = store->lease_renewed_steady_ms();
    if (!renewed) return std::nullopt;
    return store->lease_ttl_ms() - (NowMs() - *renewed);
  }

  int64_t heartbeat_ms() const override { return heartbeat_ms_; }

  std::optional<uint64_t> EpochOf(const Lid& lid) const override {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end()) return std::nullopt;
    return it->second.epoch;
  }

  void OnRegistrationChange(std::function<void(const RegistrationChange&)> cb) override {
    MutexLock lock(&mu_);
    registration_callbacks_.push_back(std::move(cb));
  }

  // ---- requests ----

  absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model,
                                       std::optional<uint32_t> group) override {
    return etcd::ReadSnapshot(*client_, std::move(model), group);
  }

  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch,
                                    std::string_view reporter) override {
    Caller caller;
    caller.name = std::string(reporter);
    caller.admin_token = options_.admin_token;
    {
      MutexLock lock(&mu_);
      // A LID of the same model that this client holds vouches for the report.
      for (const auto& [held, r] : registrations_) {
        if (held.model == lid.model) {
          caller.member = held;
          caller.member_credential = r.credential;
          break;
        }
      }
    }
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<EtcdStore> store, Store());
    return store->ReportFailed(lid, epoch, caller);
  }

  absl::Status Evict(const Lid& lid) override {
    if (options_.admin_token.empty()) {
      return absl::PermissionDeniedError(
          StrCat("a drain of ", lid.ToString(),
                 " needs the admin token (CONNEX_DIRECTORY_ADMIN_TOKEN or _FILE)"));
    }
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<EtcdStore> store, Store());
    Caller caller;
    caller.admin_token = options_.admin_token;
    return store->Leave(lid, 0, caller);
  }

  // ---- watcher side ----

  absl::Status Watch(const std::string& model) override {
    {
      MutexLock lock(&mu_);
      if (watches_.count("") || watches_.count(model)) return absl::OkStatus();
    }
    CONNEX_ASSIGN_OR_RETURN(
        std::unique_ptr<EtcdModelWatch> watch,
        EtcdModelWatch::Start(client_.get(), model, [this](const Event& e) { OnEvent(e); }));
    MutexLock lock(&mu_);
    if (model.empty()) {
      // Every model: one watch replaces the per-model ones.
      std::map<std::string, std::unique_ptr<EtcdModelWatch>> replaced;
      replaced.swap(watches_);
      watches_[""] = std::move(watch);
      retired_.push_back(std::move(replaced));
    } else if (!watches_.count("")) {
      watches_[model] = std::move(watch);
    }
    return absl::OkStatus();
  }

  std::vector<Record> View(std::string_view model, std::optional<uint32_t> group) const override {
    MutexLock lock(&mu_);
    const EtcdModelWatch* watch = nullptr;
    if (auto it = watches_.find(std::string(model)); it != watches_.end()) {
      watch = it->second.get();
    } else if (auto all = watches_.find(""); all != watches_.end()) {
      watch = all->second.get();
    }
    std::vector<Record> out;
    if (watch == nullptr) return out;
    for (Record& r : watch->View()) {
      if (r.lid.model == model && (!group || r.lid.group == *group)) out.push_back(std::move(r));
    }
    return out;
  }

  bool AwaitView(std::string_view model,
                 const std::function<bool(const std::vector<Record>&)>& predicate,
                 int64_t timeout_ms) const override {
    const int64_t deadline = NowMs() + timeout_ms;
    while (true) {
      if (predicate(View(model, std::nullopt))) return true;
      if (NowMs() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  uint64_t Subscribe(std::function<void(const Event&)> cb) override {
    MutexLock lock(&mu_);
    uint64_t id = next_subscriber_++;
    subscribers_.emplace(id, std::make_shared<std::function<void(const Event&)>>(std::move(cb)));
    return id;
  }

  void Unsubscribe(uint64_t id) override {
    {
      MutexLock lock(&mu_);
      subscribers_.erase(id);
    }
    if (!delivering) std::lock_guard<std::mutex> wait(deliver_mu_);
  }

  uint64_t view_revision() const override {
    MutexLock lock(&mu_);
    uint64_t revision = 0;
    for (const auto& [model, watch] : watches_) revision = std::max(revision, watch->revision());
    return revision;
  }
  uint64_t resnapshots() const override {
    MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [model, watch] : watches_) n += watch->resnapshots();
    return n;
  }
  uint64_t events_received() const override { return events_received_.load(); }
  const std::string& pub_address() const override { return no_pub_; }
  const std::string& directory_address() const override { return options_.directory; }
  int64_t lease_ttl_ms() const override {
    MutexLock lock(&mu_);
    return store_ ? store_->lease_ttl_ms() : lease_ttl_ms_;
  }
  void DropEventsForTest(int n) override { drop_events_.fetch_add(n); }
  void DelayEventsForTest(int ms) override {
    CONNEX_LOG_WARN("etcd directory client: DelayEventsForTest({}) is not supported", ms);
  }

 private:
  struct Registration {
    uint64_t epoch = 0;
    std::string credential;
    std::vector<std::string> addresses;
    std::map<std::string, std::string> metadata;
    int64_t renewed_ms = 0;
  };

  // The store (and with it the process's etcd lease), made on first use.
  absl::StatusOr<std::shared_ptr<EtcdStore>> Store() {
    MutexLock lock(&mu_);
    if (store_) return store_;
    etcd::EtcdStoreOptions options;
    options.lease_ttl_ms = lease_ttl_ms_;
    options.admin_token = options_.admin_token;
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<EtcdStore> store,
                            EtcdStore::Open(client_.get(), std::move(options)));
    store_ = std::move(store);
    return store_;
  }

  // Confirms (lid, epoch) with etcd; after an eviction or a lost lease joins again (new epoch)
  // or gives the LID up, and says so through the registration callbacks. FailedPrecondition when
  // `epoch` no longer holds the LID; Unavailable when etcd does not answer.
  absl::Status Check(const Lid& lid, uint64_t epoch) {
    std::shared_ptr<EtcdStore> store;
    {
      MutexLock lock(&mu_);
      store = store_;
    }
    if (!store) return absl::FailedPreconditionError("no LID held");
    const bool lease_lost = absl::IsNotFound(store->lease_status());
    absl::Status confirmed =
        lease_lost ? absl::NotFoundError(StrCat("epoch ", epoch, " of ", lid.ToString(),
                                                " is over: this process's etcd lease expired"))
                   : store->Confirm(lid, epoch);
    if (confirmed.ok()) {
      MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it != registrations_.end() && it->second.epoch == epoch) it->second.renewed_ms = NowMs();
      return confirmed;
    }
    // FailedPrecondition: superseded by another epoch, or drained — give the LID up. NotFound:
    // evicted (reported, expired, the lease lost) and free — join again under a new epoch.
    if (!absl::IsFailedPrecondition(confirmed) && !absl::IsNotFound(confirmed)) return confirmed;
    const bool superseded = absl::IsFailedPrecondition(confirmed);
    Registration r;
    {
      MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it == registrations_.end() || it->second.epoch != epoch) return confirmed;
      r = it->second;
      if (superseded || !options_.rejoin_after_eviction) registrations_.erase(it);
    }
    if (superseded || !options_.rejoin_after_eviction) {
      CONNEX_LOG_ERROR("etcd directory client: {} epoch {} is no longer ours: {}", lid.ToString(),
                       epoch, confirmed.ToString());
      RegistrationChange gone{lid, epoch, 0, confirmed};
      gone.left = EndedByLeave(confirmed);
      Notify(gone);
      return confirmed;
    }
    if (lease_lost) {
      absl::Status renewed = store->RenewLease();
      if (!renewed.ok()) return renewed;
    }
    JoinAuth exclusive;
    exclusive.exclusive = true;
    absl::StatusOr<Registry::JoinResult> joined =
        store->Join(lid, r.addresses, r.metadata, exclusive);
    if (!joined.ok()) {
      if (absl::IsFailedPrecondition(joined.status())) {
        MutexLock lock(&mu_);
        registrations_.erase(lid);
      }
      if (absl::IsFailedPrecondition(joined.status())) {
        Notify(RegistrationChange{lid, epoch, 0, joined.status()});
      }
      return confirmed;
    }
    {
      MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it != registrations_.end()) {
        it->second.epoch = joined->epoch;
        it->second.credential = joined->credential;
        it->second.renewed_ms = NowMs();
      }
    }
    CONNEX_LOG_WARN("etcd directory client: {} epoch {} was evicted; joined again as epoch {}",
                    lid.ToString(), epoch, joined->epoch);
    Notify(RegistrationChange{lid, epoch, joined->epoch, absl::OkStatus()});
    return confirmed;
  }

  void Notify(const RegistrationChange& change) {
    std::vector<std::function<void(const RegistrationChange&)>> callbacks;
    {
      MutexLock lock(&mu_);
      callbacks = registration_callbacks_;
    }
    for (auto& cb : callbacks) cb(change);
  }

  // Every heartbeat interval (or at once when an event ended one of our epochs), confirms each
  // held LID.
  void Maintain() {
    std::unique_lock<std::mutex> lock(wake_mu_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(heartbeat_ms_),
                     [this] { return stop_ || check_now_; });
      if (stop_) return;
      check_now_ = false;
      lock.unlock();
      std::vector<std::pair<Lid, uint64_t>> held;
      {
        MutexLock l(&mu_);
        for (const auto& [lid, r] : registrations_) held.emplace_back(lid, r.epoch);
      }
      for (const auto& [lid, epoch] : held) {
        absl::Status s = Check(lid, epoch);
        if (!s.ok() && !absl::IsFailedPrecondition(s)) {
          CONNEX_LOG_DEBUG("etcd directory client: confirming {} failed: {}", lid.ToString(),
                           s.ToString());
        }
      }
      lock.lock();
    }
  }

  void OnEvent(const Event& e) {
    events_received_.fetch_add(1);
    if (drop_events_.load() > 0) {
      drop_events_.fetch_sub(1);
      return;
    }
    if (e.kind == EventKind::kFailed || e.kind == EventKind::kLeft) {
      // One of our epochs ended (a report, a drain): confirm now, so that a rejoin starts at once.
      std::optional<uint64_t> epoch = EpochOf(e.record.lid);
      if (epoch && *epoch == e.record.epoch) {
        {
          std::lock_guard<std::mutex> lock(wake_mu_);
          check_now_ = true;
        }
        wake_.notify_all();
      }
    }
    std::lock_guard<std::mutex> deliver(deliver_mu_);
    delivering = true;
    std::vector<std::shared_ptr<std::function<void(const Event&)>>> callbacks;
    {
      MutexLock lock(&mu_);
      for (const auto& [id, cb] : subscribers_) callbacks.push_back(cb);
    }
    for (auto& cb : callbacks) (*cb)(e);
    delivering = false;
  }

  const DirectoryClientOptions options_;
  const std::unique_ptr<EtcdClient> client_;
  const int64_t lease_ttl_ms_;
  int64_t heartbeat_ms_ = 1000;
  const std::string no_pub_;
  std::atomic<uint64_t> events_received_{0};
  std::atomic<int> drop_events_{0};

  mutable Mutex mu_;
  std::shared_ptr<EtcdStore> store_ ABSL_GUARDED_BY(mu_);
  std::map<Lid, Registration> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(const RegistrationChange&)>> registration_callbacks_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<std::function<void(const Event&)>>> subscribers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_subscriber_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, std::unique_ptr<EtcdModelWatch>> watches_ ABSL_GUARDED_BY(mu_);
  // Per-model watches replaced by a watch of every model; stopped with the client (a callback of
  // theirs may be running while they are replaced).
  std::vector<std::map<std::string, std::unique_ptr<EtcdModelWatch>>> retired_ ABSL_GUARDED_BY(mu_);
  std::mutex deliver_mu_;  // held while subscribers run, so that Unsubscribe can wait

  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stop_ = false;       // guarded by wake_mu_
  bool check_now_ = false;  // guarded by wake_mu_
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ClientBackend>> ConnectEtcd(const DirectoryClientOptions& options) {
  etcd::EtcdClientOptions etcd_options;
  etcd_options.address = options.directory;
  // A request's deadline spans every member and an election (1-4 s): never under etcd's default.
  etcd_options.call_timeout =
      std::max(etcd_options.call_timeout, absl::Milliseconds(options.request_timeout_ms));
  etcd_options.user = EnvString("CONNEX_ETCD_USER", "");
  if (std::string file = EnvString("CONNEX_ETCD_PASSWORD_FILE", ""); !file.empty()) {
    CONNEX_ASSIGN_OR_RETURN(etcd_options.password, ReadSecretFile(file));
  }
  etcd_options.tls.ca_file = EnvString("CONNEX_ETCD_CA_FILE", "");
  etcd_options.tls.cert_file = EnvString("CONNEX_ETCD_CERT_FILE", "");
  etcd_options.tls.key_file = EnvString("CONNEX_ETCD_KEY_FILE", "");
  CONNEX_ASSIGN_OR_RETURN(int64_t lease_ttl_ms,
                          EnvInt("CONNEX_LEASE_TTL_MS", 3000, 1000, 3'600'000));
  if (options.heartbeat_ms > 0) {
    CONNEX_RETURN_IF_ERROR(ValidateLeaseSettings(lease_ttl_ms, options.heartbeat_ms));
  }
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Connect(etcd_options));
  // Like the embedded directory's HELLO: an etcd that does not answer is an error at once.
  etcd::RangeOptions probe;
  probe.count_only = true;
  absl::StatusOr<etcd::RangeResult> hello = client->Range(std::string(etcd::kRoot), probe);
  if (!hello.ok()) {
    return Annotate(hello.status(), StrCat("directory ", options.directory));
  }
  return std::make_unique<EtcdClientBackend>(options, std::move(client), lease_ttl_ms);
}

}  // namespace connex::directory::internal
