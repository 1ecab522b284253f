// EtcdClientImpl: the gRPC EtcdClient (etcd_client.h), one class whose methods sit in rooms by
// concern, after etcd's own clientv3 (kv.go, lease.go, watch.go): the members, their failover
// and auth in etcd_client.cc; Range, Put, DeleteRange, Txn and Compact in etcd_kv.cc; leases and
// the keepalive in etcd_lease.cc; watch streams in etcd_watch.cc. Thread-safe, as EtcdClient.
// Internal to connex_etcd: it includes the generated gRPC headers.
#ifndef CONNEX_DIRECTORY_ETCD_INTERNAL_ETCD_CLIENT_IMPL_H_
#define CONNEX_DIRECTORY_ETCD_INTERNAL_ETCD_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_client.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"

namespace connex::directory::etcd::client_internal {

namespace pb = ::etcdserverpb;

// The status's code; a member's UNKNOWN "context deadline exceeded" is DEADLINE_EXCEEDED.
absl::StatusCode CodeOf(const grpc::Status& status);
// The member's message and code, for an error of ours that names the member.
std::string Describe(const grpc::Status& status);
// Errors that say "this member cannot answer now", so another one may.
bool MovesOn(const grpc::Status& status);

KeyValue FromProto(const mvccpb::KeyValue& kv);

// One member: its channel and the stubs of the services we use.
struct Member {
  EtcdEndpoint endpoint;
  std::string name;  // host:port
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Maintenance::Stub> maintenance;
  std::unique_ptr<pb::Auth::Stub> auth;
};

class EtcdClientImpl final : public EtcdClient {
 public:
  EtcdClientImpl(const EtcdClientOptions& options, std::vector<EtcdEndpoint> endpoints,
                 const std::shared_ptr<grpc::ChannelCredentials>& credentials);

  absl::Status Authenticate();

  // etcd_kv.cc
  absl::StatusOr<RangeResult> Range(std::string_view key, const RangeOptions& options) override;
  absl::StatusOr<PutResult> Put(std::string_view key, std::string_view value, int64_t lease,
                                bool prev_kv) override;
  absl::StatusOr<DeleteResult> DeleteRange(std::string_view key, std::string_view range_end,
                                           bool prev_kv) override;
  absl::StatusOr<TxnResult> Transact(const Txn& txn) override;
  absl::Status Compact(int64_t revision) override;

  // etcd_lease.cc
  absl::StatusOr<LeaseGrantResult> LeaseGrant(int64_t ttl_seconds) override;
  absl::Status LeaseRevoke(int64_t lease) override;
  absl::StatusOr<LeaseTimeToLiveResult> LeaseTimeToLive(int64_t lease, bool keys) override;
  // One renewal of `lease` on a short KeepAlive stream of its own: a request, its answer, and
  // the close, all under the attempt deadline (a long-lived stream could not time out one
  // renewal on a member that stopped answering). Returns the TTL etcd reported (<= 0: the lease
  // is gone).
  absl::StatusOr<int64_t> RenewOnce(int64_t lease);
  std::unique_ptr<EtcdKeepAlive> KeepAlive(int64_t lease, absl::Duration interval) override;

  // etcd_watch.cc
  std::unique_ptr<EtcdWatch> Watch(std::string_view key, const WatchOptions& options) override;

  absl::StatusOr<MemberStatus> Status(size_t index) override;

  const std::vector<EtcdEndpoint>& members() const override { return endpoints_; }
  std::string current_member() const override { return members_[current_.load()]->name; }

  // For watches and keepalives.
  size_t current_index() const { return current_.load(); }
  size_t member_count() const { return members_.size(); }
  Member& member(size_t index) { return *members_[index % members_.size()]; }
  const EtcdClientOptions& options() const { return options_; }

  void AddMetadata(grpc::ClientContext* context, bool with_token);

  // Runs `attempt(member, context)` on the current member and, while members answer
  // Unavailable or not within the attempt timeout, on the next ones (backing off after each
  // round of the list), until one answers or the call's deadline passes. A refused auth token
  // is renewed once per call.
  template <typename Attempt>
  absl::Status Call(std::string_view rpc, Attempt&& attempt, bool with_token = true) {
    const absl::Time deadline = absl::Now() + options_.call_timeout;
    absl::Duration backoff = options_.initial_backoff;
    std::vector<std::string> failures(members_.size());
    bool token_renewed = false;
    while (true) {
      const size_t start = current_.load();
      for (size_t k = 0; k < members_.size(); ++k) {
        const absl::Time now = absl::Now();
        if (now >= deadline) break;
        const size_t index = (start + k) % members_.size();
        Member& member = *members_[index];
        grpc::ClientContext context;
        context.set_deadline(
            absl::ToChronoTime(std::min(now + options_.attempt_timeout, deadline)));
        AddMetadata(&context, with_token);
        grpc::Status status = attempt(member, &context);
        if (status.ok()) {
          size_t expected = start;
          if (index != start && current_.compare_exchange_strong(expected, index)) {
            CONNEX_LOG_INFO("etcd: {} moved to member {} ({} failed: {})", rpc, member.name,
                            members_[start]->name, failures[start]);
          }
          return absl::OkStatus();
        }
        if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED && with_token &&
            !options_.user.empty() && !token_renewed) {
          token_renewed = true;
          CONNEX_RETURN_IF_ERROR(Annotate(
              Authenticate(), StrCat("etcd: ", rpc, " on ", member.name, ": token refused (",
                                     status.error_message(), "), and a new one could not be had")));
          --k;  // the same member again, with the new token
          continue;
        }
        if (!MovesOn(status)) {
          return absl::Status(CodeOf(status),
                              StrCat("etcd: ", rpc, " on ", member.name, ": ", Describe(status)));
        }
        failures[index] = Describe(status);
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        std::string detail;
        for (size_t i = 0; i < members_.size(); ++i) {
          detail += StrCat("; ", members_[i]->name, ": ",
                           failures[i].empty() ? std::string("not tried") : failures[i]);
        }
        return absl::UnavailableError(StrCat("etcd: ", rpc, ": no member answered within ",
                                             absl::FormatDuration(options_.call_timeout), detail));
      }
      absl::SleepFor(std::min(backoff, deadline - now));
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }

 private:
  const EtcdClientOptions options_;
  const std::vector<EtcdEndpoint> endpoints_;
  std::vector<std::unique_ptr<Member>> members_;  // fixed after construction
  std::atomic<size_t> current_{0};

  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace connex::directory::etcd::client_internal

#endif  // CONNEX_DIRECTORY_ETCD_INTERNAL_ETCD_CLIENT_IMPL_H_
