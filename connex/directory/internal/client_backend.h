// The backend behind a DirectoryClient (client.h), chosen by the directory address alone:
// `tcp://HOST:PORT` is the embedded connex-directory (client.cc), `etcd://H1:P1,...` an etcd
// cluster talked to directly (etcd/etcd_directory_client.cc). Each method has the contract of the
// DirectoryClient method of the same name; the membership rules themselves live in shared code
// (registry.h on the embedded server, etcd/etcd_store.h on etcd). Thread-safe.
#ifndef CONNEX_DIRECTORY_INTERNAL_CLIENT_BACKEND_H_
#define CONNEX_DIRECTORY_INTERNAL_CLIENT_BACKEND_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/directory/protocol.h"

namespace connex::directory {

struct DirectoryClientOptions;
struct RegistrationChange;

namespace internal {

class ClientBackend {
 public:
  virtual ~ClientBackend() = default;

  virtual absl::StatusOr<uint64_t> Join(const Lid& lid, std::vector<std::string> addresses,
                                        std::map<std::string, std::string> metadata,
                                        bool force) = 0;
  virtual absl::Status Leave(const Lid& lid) = 0;
  virtual absl::Status LeaveAll() = 0;
  virtual absl::StatusOr<uint64_t> Renew(const Lid& lid) = 0;
  virtual std::optional<int64_t> RenewalAgeMs(const Lid& lid) const = 0;
  virtual std::optional<int64_t> LeaseLeftMs(const Lid& lid) const = 0;
  virtual int64_t heartbeat_ms() const = 0;
  virtual std::optional<uint64_t> EpochOf(const Lid& lid) const = 0;
  virtual void OnRegistrationChange(std::function<void(const RegistrationChange&)> cb) = 0;
  virtual absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model,
                                               std::optional<uint32_t> group) = 0;
  virtual absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch,
                                            std::string_view reporter) = 0;
  virtual absl::Status Evict(const Lid& lid) = 0;
  virtual absl::Status Watch(const std::string& model) = 0;
  virtual std::vector<Record> View(std::string_view model, std::optional<uint32_t> group) const = 0;
  virtual bool AwaitView(std::string_view model,
                         const std::function<bool(const std::vector<Record>&)>& predicate,
                         int64_t timeout_ms) const = 0;
  virtual uint64_t Subscribe(std::function<void(const Event&)> cb) = 0;
  virtual void Unsubscribe(uint64_t id) = 0;
  virtual uint64_t view_revision() const = 0;
  virtual uint64_t resnapshots() const = 0;
  virtual uint64_t events_received() const = 0;
  virtual const std::string& pub_address() const = 0;
  virtual const std::string& directory_address() const = 0;
  virtual int64_t lease_ttl_ms() const = 0;
  virtual void DropEventsForTest(int n) = 0;
  virtual void DelayEventsForTest(int ms) = 0;
};

// The etcd backend (etcd/etcd_directory_client.cc) for an `etcd://` address.
absl::StatusOr<std::unique_ptr<ClientBackend>> ConnectEtcd(const DirectoryClientOptions& options);

}  // namespace internal
}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_INTERNAL_CLIENT_BACKEND_H_
