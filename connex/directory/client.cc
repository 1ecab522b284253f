#include "connex/directory/client.h"

#include <map>
#include <utility>

#include "connex/base/clock.h"
#include "connex/base/config.h"
#include "connex/base/mutex.h"
#include "connex/base/secret_file.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/internal/lease_keeper.h"
#include "connex/directory/internal/store.h"
#include "connex/directory/internal/watched_view.h"
#include "connex/directory/secret.h"

namespace connex::directory {

absl::StatusOr<DirectoryClientOptions> DirectoryClientOptions::FromEnv() {
  DirectoryClientOptions o;
  o.directory = EnvString("CONNEX_DIRECTORY", o.directory);
  CONNEX_ASSIGN_OR_RETURN(o.token, ClientTokenFromEnv());
  CONNEX_ASSIGN_OR_RETURN(o.admin_token, AdminTokenFromEnv());
  CONNEX_ASSIGN_OR_RETURN(o.heartbeat_ms, EnvInt("CONNEX_HEARTBEAT_MS", 0, 0, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.request_timeout_ms, EnvInt("CONNEX_DIRECTORY_TIMEOUT_MS",
                                                       o.request_timeout_ms, 1, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.curve, CurveSettings::FromEnv());
  CONNEX_ASSIGN_OR_RETURN(o.etcd, Etcd::FromEnv());
  return o;
}

absl::StatusOr<DirectoryClientOptions::Etcd> DirectoryClientOptions::Etcd::FromEnv() {
  Etcd e;
  e.user = EnvString("CONNEX_ETCD_USER", "");
  if (std::string file = EnvString("CONNEX_ETCD_PASSWORD_FILE", ""); !file.empty()) {
    CONNEX_ASSIGN_OR_RETURN(e.password, ReadSecretFile(file));
  }
  e.ca_file = EnvString("CONNEX_ETCD_CA_FILE", "");
  e.cert_file = EnvString("CONNEX_ETCD_CERT_FILE", "");
  e.key_file = EnvString("CONNEX_ETCD_KEY_FILE", "");
  CONNEX_ASSIGN_OR_RETURN(e.lease_ttl_ms,
                          EnvInt("CONNEX_LEASE_TTL_MS", e.lease_ttl_ms, 1000, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(e.attempt_timeout_ms, EnvInt("CONNEX_ETCD_ATTEMPT_TIMEOUT_MS",
                                                       e.attempt_timeout_ms, 50, 60'000));
  CONNEX_ASSIGN_OR_RETURN(e.watch_probe_ms,
                          EnvInt("CONNEX_ETCD_WATCH_PROBE_MS", e.watch_probe_ms, 100, 600'000));
  return e;
}

namespace internal {
namespace {

Mutex& StoresMutex() {
  static Mutex mu;
  return mu;
}
std::map<std::string, StoreFactory>& Stores() ABSL_EXCLUSIVE_LOCKS_REQUIRED(StoresMutex()) {
  static auto* stores = new std::map<std::string, StoreFactory>();
  return *stores;
}

absl::StatusOr<std::unique_ptr<DirectoryStore>> OpenStore(const DirectoryClientOptions& options,
                                                          WatchSink* sink) {
  const std::string& address = options.directory;
  const size_t colon = address.find("://");
  const std::string scheme = colon == std::string::npos ? "" : address.substr(0, colon);
  if (scheme == "tcp") return OpenZmqStore(options, sink);
  auto registered = [&scheme]() -> StoreFactory {
    MutexLock lock(&StoresMutex());
    auto it = Stores().find(scheme);
    return it == Stores().end() ? StoreFactory() : it->second;
  };
  if (StoreFactory factory = registered()) return factory(options, sink);
  if (scheme == "etcd") {
    // Not linked in: the etcd plugin (libconnex-etcd.so), which registers the backend.
    if (absl::Status loaded = LoadStorePlugin(scheme); !loaded.ok()) {
      return Annotate(loaded, StrCat("directory ", address));
    }
    if (StoreFactory factory = registered()) return factory(options, sink);
    return absl::FailedPreconditionError(
        StrCat("directory ", address,
               ": the etcd plugin loaded but registered no backend (was this program linked with "
               "ENABLE_EXPORTS?)"));
  }
  return absl::InvalidArgumentError(StrCat("directory '", address,
                                           "' must look like tcp://HOST:PORT (connex-directory) or "
                                           "etcd://HOST:PORT[,HOST:PORT...]"));
}

}  // namespace

void RegisterStore(const std::string& scheme, StoreFactory factory) {
  MutexLock lock(&StoresMutex());
  Stores()[scheme] = std::move(factory);
}

}  // namespace internal

// The client, written once: the store of the address's backend, the lease keeper above it and
// the watched view it feeds. The keeper uses the store (renewals) and the store's threads use
// the keeper (through the view: an epoch of ours that ended), so they stop in steps: the
// keeper's thread, then the store's threads, then the view's delivery (its delay thread, a test
// hook's), then the keeper goes, then the view.
class DirectoryClient::Impl {
 public:
  explicit Impl(DirectoryClientOptions options)
      : options_(std::move(options)),
        clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
        view_(clock_) {}

  ~Impl() {
    if (keeper_) keeper_->Stop();
    store_.reset();
    view_.StopDelivery();
    keeper_.reset();
  }

  absl::Status Open() {
    CONNEX_ASSIGN_OR_RETURN(store_, internal::OpenStore(options_, &view_));
    keeper_ = std::make_unique<internal::LeaseKeeper>(store_.get(), options_, clock_);
    // No watch runs yet: the view delivers nothing before this is set.
    view_.OnEpochEnded(
        [keeper = keeper_.get()](const Event& event) { keeper->OnEpochEnded(event); });
    return absl::OkStatus();
  }

  const DirectoryClientOptions options_;
  Clock* const clock_;
  internal::WatchedView view_;
  std::unique_ptr<internal::DirectoryStore> store_;
  std::unique_ptr<internal::LeaseKeeper> keeper_;
};

DirectoryClient::DirectoryClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DirectoryClient::~DirectoryClient() = default;

absl::StatusOr<std::unique_ptr<DirectoryClient>> DirectoryClient::Connect(
    DirectoryClientOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  CONNEX_RETURN_IF_ERROR(impl->Open());
  return std::unique_ptr<DirectoryClient>(new DirectoryClient(std::move(impl)));
}

absl::StatusOr<uint64_t> DirectoryClient::Join(const Lid& lid, std::vector<std::string> addresses,
                                               std::map<std::string, std::string> metadata) {
  return impl_->keeper_->Join(lid, std::move(addresses), std::move(metadata), /*force=*/false);
}
absl::StatusOr<uint64_t> DirectoryClient::ForceJoin(const Lid& lid,
                                                    std::vector<std::string> addresses,
                                                    std::map<std::string, std::string> metadata) {
  return impl_->keeper_->Join(lid, std::move(addresses), std::move(metadata), /*force=*/true);
}
absl::Status DirectoryClient::Leave(const Lid& lid) { return impl_->keeper_->Leave(lid); }
absl::Status DirectoryClient::LeaveAll() { return impl_->keeper_->LeaveAll(); }
absl::StatusOr<uint64_t> DirectoryClient::Renew(const Lid& lid) {
  return impl_->keeper_->Renew(lid);
}
std::optional<uint64_t> DirectoryClient::EpochOf(const Lid& lid) const {
  return impl_->keeper_->EpochOf(lid);
}
std::shared_ptr<const HeldLease> DirectoryClient::Lease(const Lid& lid) {
  return impl_->keeper_->Lease(lid);
}

void DirectoryClient::OnRegistrationChange(std::function<void(const RegistrationChange&)> cb) {
  impl_->keeper_->OnRegistrationChange(std::move(cb));
}
absl::StatusOr<Snapshot> DirectoryClient::GetSnapshot(std::optional<std::string> model,
                                                      std::optional<uint32_t> group) {
  return impl_->store_->GetSnapshot(std::move(model), group);
}
absl::StatusOr<bool> DirectoryClient::ReportFailed(const Lid& lid, uint64_t epoch,
                                                   std::string_view reporter) {
  return impl_->store_->ReportFailed(lid, epoch, impl_->keeper_->Voucher(lid, reporter));
}
absl::Status DirectoryClient::Evict(const Lid& lid) {
  if (impl_->options_.admin_token.empty()) {
    return absl::PermissionDeniedError(
        StrCat("a drain of ", lid.ToString(),
               " needs the admin token (CONNEX_DIRECTORY_ADMIN_TOKEN or _FILE); its holder "
               "leaves with its own credential"));
  }
  Caller drain;
  drain.admin_token = impl_->options_.admin_token;
  return impl_->store_->Leave(lid, 0, drain);
}
absl::Status DirectoryClient::Watch(std::string model) {
  if (!model.empty()) CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(model));
  return impl_->store_->Watch(model);
}
std::vector<Record> DirectoryClient::View(std::string_view model,
                                          std::optional<uint32_t> group) const {
  return impl_->view_.View(model, group);
}
uint64_t DirectoryClient::Subscribe(std::function<void(const Event&)> cb) {
  return impl_->view_.Subscribe(std::move(cb));
}
void DirectoryClient::Unsubscribe(uint64_t id) { impl_->view_.Unsubscribe(id); }
bool DirectoryClient::AwaitView(std::string_view model,
                                const std::function<bool(const std::vector<Record>&)>& predicate,
                                int64_t timeout_ms) const {
  return impl_->view_.AwaitView(model, predicate, timeout_ms);
}
uint64_t DirectoryClient::view_revision() const { return impl_->store_->view_revision(); }
uint64_t DirectoryClient::resnapshots() const { return impl_->view_.resnapshots(); }
uint64_t DirectoryClient::events_received() const { return impl_->store_->events_received(); }
const std::string& DirectoryClient::pub_address() const { return impl_->store_->pub_address(); }
const std::string& DirectoryClient::directory_address() const { return impl_->options_.directory; }
int64_t DirectoryClient::lease_ttl_ms() const { return impl_->store_->lease_ttl_ms(); }
int64_t DirectoryClient::heartbeat_ms() const { return impl_->keeper_->heartbeat_ms(); }
std::optional<int64_t> DirectoryClient::RenewalAgeMs(const Lid& lid) const {
  return impl_->keeper_->RenewalAgeMs(lid);
}
std::optional<int64_t> DirectoryClient::LeaseLeftMs(const Lid& lid) const {
  return impl_->keeper_->LeaseLeftMs(lid);
}
void DirectoryClient::DropEventsForTest(int n) { impl_->store_->DropEventsForTest(n); }
void DirectoryClient::DelayEventsForTest(int ms) { impl_->view_.DelayEventsForTest(ms); }

}  // namespace connex::directory
