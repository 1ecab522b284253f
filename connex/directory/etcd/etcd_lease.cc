// EtcdClient's leases (the class is internal/etcd_client_impl.h): LeaseGrant, LeaseRevoke,
// LeaseTimeToLive, and the keepalive — a thread that renews one lease every interval, each renewal
// a short KeepAlive stream of its own (RenewOnce) that fails over like any call.
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "connex/base/clock.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/internal/etcd_client_impl.h"

namespace connex::directory::etcd::client_internal {
namespace {

int64_t SteadyNowMs() { return RealClock::Get()->NowMs(); }

class KeepAliveImpl final : public EtcdKeepAlive {
 public:
  KeepAliveImpl(EtcdClientImpl* client, int64_t lease, absl::Duration interval)
      : client_(client), lease_(lease), interval_(interval) {
    thread_ = std::thread([this] { Run(); });
  }
  ~KeepAliveImpl() override {
    Stop();
    thread_.join();
  }

  absl::Status status() const override {
    MutexLock lock(&mu_);
    return status_;
  }
  int64_t last_ttl_seconds() const override {
    MutexLock lock(&mu_);
    return last_ttl_;
  }
  int64_t renewals() const override {
    MutexLock lock(&mu_);
    return renewals_;
  }
  int64_t renewed_steady_ms() const override {
    MutexLock lock(&mu_);
    return renewed_steady_ms_;
  }
  void Stop() override {
    MutexLock lock(&mu_);
    stopped_ = true;
  }

 private:
  void Run();

  EtcdClientImpl* const client_;
  const int64_t lease_;
  const absl::Duration interval_;
  std::thread thread_;

  mutable Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t last_ttl_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t renewals_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t renewed_steady_ms_ ABSL_GUARDED_BY(mu_) = SteadyNowMs();
};

void KeepAliveImpl::Run() {
  while (true) {
    const int64_t sent_ms = SteadyNowMs();
    absl::StatusOr<int64_t> ttl = client_->RenewOnce(lease_);
    MutexLock lock(&mu_);
    if (stopped_) return;
    if (ttl.ok() && *ttl <= 0) {
      status_ = absl::NotFoundError(
          StrCat("etcd: lease ", lease_, " has expired or was revoked; grant a new one"));
      CONNEX_LOG_WARN("{}", status_.message());
      return;
    }
    if (ttl.ok()) {
      last_ttl_ = *ttl;
      ++renewals_;
      renewed_steady_ms_ = sent_ms;
    } else {
      // Every member failed for a whole call: the lease may still be alive (an etcd outage
      // shorter than its TTL evicts nobody); try again at the next interval.
      CONNEX_LOG_WARN("etcd: keepalive of lease {}: {}", lease_, ttl.status().message());
    }
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), interval_)) return;
  }
}

}  // namespace

absl::StatusOr<LeaseGrantResult> EtcdClientImpl::LeaseGrant(int64_t ttl_seconds) {
  pb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  pb::LeaseGrantResponse response;
  CONNEX_RETURN_IF_ERROR(Call("LeaseGrant", [&](Member& member, grpc::ClientContext* context) {
    return member.lease->LeaseGrant(context, request, &response);
  }));
  if (!response.error().empty()) {
    return absl::FailedPreconditionError(StrCat("etcd: LeaseGrant: ", response.error()));
  }
  return LeaseGrantResult{response.id(), response.ttl()};
}

absl::Status EtcdClientImpl::LeaseRevoke(int64_t lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  pb::LeaseRevokeResponse response;
  return Call("LeaseRevoke", [&](Member& member, grpc::ClientContext* context) {
    return member.lease->LeaseRevoke(context, request, &response);
  });
}

absl::StatusOr<LeaseTimeToLiveResult> EtcdClientImpl::LeaseTimeToLive(int64_t lease, bool keys) {
  pb::LeaseTimeToLiveRequest request;
  request.set_id(lease);
  request.set_keys(keys);
  pb::LeaseTimeToLiveResponse response;
  CONNEX_RETURN_IF_ERROR(Call("LeaseTimeToLive", [&](Member& member, grpc::ClientContext* context) {
    return member.lease->LeaseTimeToLive(context, request, &response);
  }));
  LeaseTimeToLiveResult out;
  out.id = response.id();
  out.ttl_seconds = response.ttl();
  out.granted_ttl_seconds = response.grantedttl();
  for (const std::string& key : response.keys()) out.keys.push_back(key);
  return out;
}

absl::StatusOr<int64_t> EtcdClientImpl::RenewOnce(int64_t lease) {
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  pb::LeaseKeepAliveResponse response;
  CONNEX_RETURN_IF_ERROR(Call("LeaseKeepAlive", [&](Member& member, grpc::ClientContext* context) {
    auto stream = member.lease->LeaseKeepAlive(context);
    if (stream->Write(request) && stream->Read(&response)) {
      stream->WritesDone();
      return stream->Finish();
    }
    grpc::Status status = stream->Finish();
    if (status.ok()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream closed before an answer");
    }
    return status;
  }));
  return response.ttl();
}

std::unique_ptr<EtcdKeepAlive> EtcdClientImpl::KeepAlive(int64_t lease, absl::Duration interval) {
  return std::make_unique<KeepAliveImpl>(this, lease, interval);
}

}  // namespace connex::directory::etcd::client_internal
