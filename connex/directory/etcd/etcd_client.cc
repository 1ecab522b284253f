#include "connex/directory/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/time/clock.h"
#include "connex/base/clock.h"
#include "connex/base/logging.h"
#include "connex/base/logging_spdlog.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"

namespace connex::directory::etcd {
namespace {

namespace pb = ::etcdserverpb;

constexpr char kCompactPayloadUrl[] = "type.connex.dev/etcd.compact_revision";

int64_t SteadyNowMs() { return RealClock::Get()->NowMs(); }

// etcd's metadata keys (clientv3's rpctypes): the auth token, and "refuse me unless you have a
// leader" — so that a member cut off from the quorum fails our calls and streams (and we move
// on) instead of serving stale reads or a watch that never sees another event.
constexpr char kTokenKey[] = "token";
constexpr char kRequireLeaderKey[] = "hasleader";

absl::StatusCode CodeOf(const grpc::Status& status) {
  return static_cast<absl::StatusCode>(status.error_code());
}

std::string Describe(const grpc::Status& status) {
  std::string text = status.error_message();
  if (text.empty()) text = "no message";
  return StrCat(text, " (", absl::StatusCodeToString(CodeOf(status)), ")");
}

// Errors that say "this member cannot answer now", so another one may.
bool MovesOn(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

RangeResult FromProto(const pb::RangeResponse& response) {
  RangeResult out;
  out.revision = response.header().revision();
  out.kvs.reserve(response.kvs_size());
  for (const auto& kv : response.kvs()) out.kvs.push_back(FromProto(kv));
  out.more = response.more();
  out.count = response.count();
  return out;
}

PutResult FromProto(const pb::PutResponse& response) {
  PutResult out;
  out.revision = response.header().revision();
  if (response.has_prev_kv()) out.prev_kv = FromProto(response.prev_kv());
  return out;
}

DeleteResult FromProto(const pb::DeleteRangeResponse& response) {
  DeleteResult out;
  out.revision = response.header().revision();
  out.deleted = response.deleted();
  for (const auto& kv : response.prev_kvs()) out.prev_kvs.push_back(FromProto(kv));
  return out;
}

void ToProto(std::string_view key, const RangeOptions& options, pb::RangeRequest* request) {
  request->set_key(std::string(key));
  request->set_range_end(options.range_end);
  request->set_limit(options.limit);
  request->set_revision(options.revision);
  request->set_serializable(options.serializable);
  request->set_keys_only(options.keys_only);
  request->set_count_only(options.count_only);
}

void ToProto(const Compare& compare, pb::Compare* out) {
  out->set_key(compare.key);
  switch (compare.result) {
    case Compare::Result::kEqual:
      out->set_result(pb::Compare::EQUAL);
      break;
    case Compare::Result::kGreater:
      out->set_result(pb::Compare::GREATER);
      break;
    case Compare::Result::kLess:
      out->set_result(pb::Compare::LESS);
      break;
    case Compare::Result::kNotEqual:
      out->set_result(pb::Compare::NOT_EQUAL);
      break;
  }
  switch (compare.target) {
    case Compare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(compare.number);
      break;
    case Compare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(compare.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(compare.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(compare.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(compare.number);
      break;
  }
}

void ToProto(const TxnOp& op, pb::RequestOp* out) {
  switch (op.kind) {
    case TxnOp::Kind::kRange: {
      auto* range = out->mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(op.range_end);
      break;
    }
    case TxnOp::Kind::kPut: {
      auto* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      put->set_prev_kv(op.prev_kv);
      break;
    }
    case TxnOp::Kind::kDelete: {
      auto* del = out->mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(op.range_end);
      del->set_prev_kv(op.prev_kv);
      break;
    }
  }
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        StrCat("etcd TLS: cannot read the ", what, " file '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::InvalidArgumentError(
        StrCat("etcd TLS: the ", what, " file '", path, "' is empty"));
  }
  return text.str();
}

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

class EtcdClientImpl;

class WatchImpl final : public EtcdWatch {
 public:
  WatchImpl(EtcdClientImpl* client, std::string key, const WatchOptions& options)
      : client_(client), key_(std::move(key)), options_(options) {
    next_revision_ = options.start_revision;
    thread_ = std::thread([this] { Run(); });
  }
  ~WatchImpl() override {
    Cancel();
    thread_.join();
  }

  absl::StatusOr<WatchResponse> Next(absl::Duration timeout) override;
  void Cancel() override;
  std::string member() const override {
    MutexLock lock(&mu_);
    return member_;
  }
  int64_t next_revision() const override {
    MutexLock lock(&mu_);
    return next_revision_;
  }

 private:
  void Run();
  // Streams from one member until the stream ends; returns whether the member confirmed the
  // watch (so the next failure starts a new round without backoff). The end is logged as a
  // warning, or at debug level when `quiet` (the members after the first that failed in a row:
  // an election makes every member refuse for a second).
  bool StreamFrom(const Member& member, bool quiet);

  EtcdClientImpl* const client_;
  const std::string key_;
  const WatchOptions options_;
  std::thread thread_;

  mutable Mutex mu_;
  std::deque<WatchResponse> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status over_ ABSL_GUARDED_BY(mu_);  // not OK: the watch ended for this reason
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_revision_ ABSL_GUARDED_BY(mu_);
  std::string member_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

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

class EtcdClientImpl final : public EtcdClient {
 public:
  EtcdClientImpl(const EtcdClientOptions& options, std::vector<EtcdEndpoint> endpoints,
                 const std::shared_ptr<grpc::ChannelCredentials>& credentials)
      : options_(options), endpoints_(std::move(endpoints)) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
                static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
    // Ping only while a call or stream is open (etcd refuses idle pings), for as long as it
    // stays open without data (a quiet watch).
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    // A member that comes back is reconnected within about a second, not gRPC's default two
    // minutes at worst. (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the timeout of
    // one connect, and a short one fails every connect to a busy member.)
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    // A Range of a whole model or a watch response may pass gRPC's default 4 MiB; etcd bounds
    // its own messages (--max-request-bytes, and ranges by the caller's limit), as clientv3 does.
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    for (const EtcdEndpoint& endpoint : endpoints_) {
      auto member = std::make_unique<Member>();
      member->endpoint = endpoint;
      member->name = endpoint.ToString();
      member->channel = grpc::CreateCustomChannel(member->name, credentials, args);
      member->kv = pb::KV::NewStub(member->channel);
      member->lease = pb::Lease::NewStub(member->channel);
      member->watch = pb::Watch::NewStub(member->channel);
      member->maintenance = pb::Maintenance::NewStub(member->channel);
      member->auth = pb::Auth::NewStub(member->channel);
      members_.push_back(std::move(member));
    }
  }

  absl::Status Authenticate() {
    pb::AuthenticateRequest request;
    request.set_name(options_.user);
    request.set_password(options_.password);
    pb::AuthenticateResponse response;
    CONNEX_RETURN_IF_ERROR(Call(
        "Authenticate",
        [&](Member& member, grpc::ClientContext* context) {
          return member.auth->Authenticate(context, request, &response);
        },
        /*with_token=*/false));
    MutexLock lock(&mu_);
    token_ = response.token();
    return absl::OkStatus();
  }

  absl::StatusOr<RangeResult> Range(std::string_view key, const RangeOptions& options) override {
    pb::RangeRequest request;
    ToProto(key, options, &request);
    pb::RangeResponse response;
    CONNEX_RETURN_IF_ERROR(Call("Range", [&](Member& member, grpc::ClientContext* context) {
      return member.kv->Range(context, request, &response);
    }));
    return FromProto(response);
  }

  absl::StatusOr<PutResult> Put(std::string_view key, std::string_view value, int64_t lease,
                                bool prev_kv) override {
    pb::PutRequest request;
    request.set_key(std::string(key));
    request.set_value(std::string(value));
    request.set_lease(lease);
    request.set_prev_kv(prev_kv);
    pb::PutResponse response;
    CONNEX_RETURN_IF_ERROR(Call("Put", [&](Member& member, grpc::ClientContext* context) {
      return member.kv->Put(context, request, &response);
    }));
    return FromProto(response);
  }

  absl::StatusOr<DeleteResult> DeleteRange(std::string_view key, std::string_view range_end,
                                           bool prev_kv) override {
    pb::DeleteRangeRequest request;
    request.set_key(std::string(key));
    request.set_range_end(std::string(range_end));
    request.set_prev_kv(prev_kv);
    pb::DeleteRangeResponse response;
    CONNEX_RETURN_IF_ERROR(Call("DeleteRange", [&](Member& member, grpc::ClientContext* context) {
      return member.kv->DeleteRange(context, request, &response);
    }));
    return FromProto(response);
  }

  absl::StatusOr<TxnResult> Transact(const Txn& txn) override {
    pb::TxnRequest request;
    for (const Compare& compare : txn.compare) ToProto(compare, request.add_compare());
    for (const TxnOp& op : txn.success) ToProto(op, request.add_success());
    for (const TxnOp& op : txn.failure) ToProto(op, request.add_failure());
    pb::TxnResponse response;
    CONNEX_RETURN_IF_ERROR(Call("Txn", [&](Member& member, grpc::ClientContext* context) {
      return member.kv->Txn(context, request, &response);
    }));
    TxnResult out;
    out.succeeded = response.succeeded();
    out.revision = response.header().revision();
    for (const pb::ResponseOp& op : response.responses()) {
      TxnOpResult result;
      switch (op.response_case()) {
        case pb::ResponseOp::kResponseRange:
          result.kind = TxnOp::Kind::kRange;
          result.range = FromProto(op.response_range());
          break;
        case pb::ResponseOp::kResponsePut:
          result.kind = TxnOp::Kind::kPut;
          result.put = FromProto(op.response_put());
          break;
        case pb::ResponseOp::kResponseDeleteRange:
          result.kind = TxnOp::Kind::kDelete;
          result.del = FromProto(op.response_delete_range());
          break;
        default:
          // We send no nested transactions, so a member that answers one is broken.
          return absl::DataLossError(StrCat("etcd: Txn: a response of kind ",
                                            static_cast<int>(op.response_case()),
                                            " to a transaction without nested transactions"));
      }
      out.results.push_back(std::move(result));
    }
    return out;
  }

  absl::Status Compact(int64_t revision) override {
    pb::CompactionRequest request;
    request.set_revision(revision);
    pb::CompactionResponse response;
    return Call("Compact", [&](Member& member, grpc::ClientContext* context) {
      return member.kv->Compact(context, request, &response);
    });
  }

  absl::StatusOr<LeaseGrantResult> LeaseGrant(int64_t ttl_seconds) override {
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

  absl::Status LeaseRevoke(int64_t lease) override {
    pb::LeaseRevokeRequest request;
    request.set_id(lease);
    pb::LeaseRevokeResponse response;
    return Call("LeaseRevoke", [&](Member& member, grpc::ClientContext* context) {
      return member.lease->LeaseRevoke(context, request, &response);
    });
  }

  absl::StatusOr<LeaseTimeToLiveResult> LeaseTimeToLive(int64_t lease, bool keys) override {
    pb::LeaseTimeToLiveRequest request;
    request.set_id(lease);
    request.set_keys(keys);
    pb::LeaseTimeToLiveResponse response;
    CONNEX_RETURN_IF_ERROR(
        Call("LeaseTimeToLive", [&](Member& member, grpc::ClientContext* context) {
          return member.lease->LeaseTimeToLive(context, request, &response);
        }));
    LeaseTimeToLiveResult out;
    out.id = response.id();
    out.ttl_seconds = response.ttl();
    out.granted_ttl_seconds = response.grantedttl();
    for (const std::string& key : response.keys()) out.keys.push_back(key);
    return out;
  }

  // One renewal of `lease` on a short KeepAlive stream of its own: a request, its answer, and
  // the close, all under the attempt deadline (a long-lived stream could not time out one
  // renewal on a member that stopped answering). Returns the TTL etcd reported (<= 0: the lease
  // is gone).
  absl::StatusOr<int64_t> RenewOnce(int64_t lease) {
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    pb::LeaseKeepAliveResponse response;
    CONNEX_RETURN_IF_ERROR(Call("LeaseKeepAlive", [&](Member& member,
                                                      grpc::ClientContext* context) {
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

  std::unique_ptr<EtcdKeepAlive> KeepAlive(int64_t lease, absl::Duration interval) override {
    return std::make_unique<KeepAliveImpl>(this, lease, interval);
  }

  std::unique_ptr<EtcdWatch> Watch(std::string_view key, const WatchOptions& options) override {
    return std::make_unique<WatchImpl>(this, std::string(key), options);
  }

  absl::StatusOr<MemberStatus> Status(size_t index) override {
    if (index >= members_.size()) {
      return absl::InvalidArgumentError(
          StrCat("etcd: Status: member ", index, " of ", members_.size()));
    }
    Member& member = *members_[index];
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.attempt_timeout));
    AddMetadata(&context, /*with_token=*/true);
    pb::StatusRequest request;
    pb::StatusResponse response;
    grpc::Status status = member.maintenance->Status(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(CodeOf(status),
                          StrCat("etcd: Status on ", member.name, ": ", Describe(status)));
    }
    MemberStatus out;
    out.endpoint = member.name;
    out.member_id = response.header().member_id();
    out.leader_id = response.leader();
    out.raft_term = response.raftterm();
    out.revision = response.header().revision();
    out.version = response.version();
    return out;
  }

  const std::vector<EtcdEndpoint>& members() const override { return endpoints_; }
  std::string current_member() const override { return members_[current_.load()]->name; }

  // For watches and keepalives.
  size_t current_index() const { return current_.load(); }
  size_t member_count() const { return members_.size(); }
  Member& member(size_t index) { return *members_[index % members_.size()]; }
  const EtcdClientOptions& options() const { return options_; }

  void AddMetadata(grpc::ClientContext* context, bool with_token) {
    context->AddMetadata(kRequireLeaderKey, "true");
    if (!with_token) return;
    MutexLock lock(&mu_);
    if (!token_.empty()) context->AddMetadata(kTokenKey, token_);
  }

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

absl::StatusOr<WatchResponse> WatchImpl::Next(absl::Duration timeout) {
  MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || !over_.ok() || cancelled_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (!queue_.empty()) {
    WatchResponse response = std::move(queue_.front());
    queue_.pop_front();
    return response;
  }
  if (!over_.ok()) return over_;
  if (cancelled_) return absl::CancelledError(StrCat("etcd: watch of '", key_, "' was cancelled"));
  return absl::DeadlineExceededError(
      StrCat("etcd: watch of '", key_, "': nothing within ", absl::FormatDuration(timeout)));
}

void WatchImpl::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

void WatchImpl::Run() {
  const EtcdClientOptions& options = client_->options();
  absl::Duration backoff = options.initial_backoff;
  size_t index = client_->current_index();
  size_t failed_in_a_row = 0;
  while (true) {
    {
      MutexLock lock(&mu_);
      if (cancelled_ || !over_.ok()) return;
    }
    bool confirmed = StreamFrom(client_->member(index), /*quiet=*/failed_in_a_row > 0);
    {
      MutexLock lock(&mu_);
      if (cancelled_ || !over_.ok()) return;
    }
    if (confirmed) {
      failed_in_a_row = 0;
      backoff = options.initial_backoff;
    } else if (++failed_in_a_row % client_->member_count() == 0) {
      MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), backoff);
      backoff = std::min(backoff * 2, options.max_backoff);
    }
    ++index;
  }
}

bool WatchImpl::StreamFrom(const Member& member, bool quiet) {
  grpc::ClientContext context;
  client_->AddMetadata(&context, /*with_token=*/true);
  pb::WatchRequest request;
  {
    MutexLock lock(&mu_);
    if (cancelled_) return false;
    context_ = &context;
    member_ = member.name;
    pb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(options_.range_end);
    create->set_start_revision(next_revision_);
    create->set_prev_kv(options_.prev_kv);
    create->set_progress_notify(options_.progress_notify);
  }
  auto stream = member.watch->Watch(&context);
  bool confirmed = false;
  std::string ended;
  if (stream->Write(request)) {
    // The probe: after probe_interval without a response, ask the member for progress; no answer
    // within the attempt timeout means the member is stopped or cut off, and the stream is
    // cancelled (so that the watch moves on in about a second, not after gRPC's keepalive).
    // gRPC allows this one writer beside the reading thread.
    bool stream_done = false;
    absl::Time last_response = absl::Now();
    std::thread probe([&] {
      const EtcdClientOptions& options = client_->options();
      std::optional<absl::Time> probe_sent;
      MutexLock lock(&mu_);
      auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stream_done || cancelled_; };
      while (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(100))) {
        const absl::Time now = absl::Now();
        if (probe_sent.has_value() && last_response >= *probe_sent) probe_sent.reset();
        if (probe_sent.has_value()) {
          if (now - *probe_sent > options.attempt_timeout) {
            ended = StrCat("no answer to a progress request within ",
                           absl::FormatDuration(options.attempt_timeout));
            context.TryCancel();
            return;
          }
        } else if (now - last_response > options.watch_probe_interval) {
          pb::WatchRequest progress;
          progress.mutable_progress_request();
          probe_sent = now;
          mu_.Unlock();
          bool written = stream->Write(progress);
          mu_.Lock();
          if (!written) return;  // the stream is over; Read sees it too
        }
      }
    });
    pb::WatchResponse response;
    while (stream->Read(&response)) {
      MutexLock lock(&mu_);
      last_response = absl::Now();
      // The answer to a progress request (watch id -1) proves the member alive, nothing more:
      // etcd 3.4 gives it the store's revision even while this watcher's events are still on
      // their way, so it is not a progress notification.
      if (response.watch_id() == -1 && !response.created() && response.events_size() == 0) {
        continue;
      }
      if (response.compact_revision() != 0) {
        over_ = absl::OutOfRangeError(
            StrCat("etcd: watch of '", key_, "' on ", member.name, ": revision ", next_revision_,
                   " has been compacted (compacted up to ", response.compact_revision(),
                   "): take a snapshot and watch again from after its revision"));
        over_.SetPayload(kCompactPayloadUrl,
                         absl::Cord(std::to_string(response.compact_revision())));
        context.TryCancel();
        break;
      }
      if (response.canceled()) {
        // A watch that etcd cancels for a reason of its own (a permission, a bad range) stays
        // cancelled on every member; a member that lost its leader cancels with "no leader".
        const std::string& reason = response.cancel_reason();
        if (reason.find("no leader") != std::string::npos) {
          ended = reason;
          context.TryCancel();
          break;
        }
        absl::StatusCode code = reason.find("permission denied") != std::string::npos
                                    ? absl::StatusCode::kPermissionDenied
                                    : absl::StatusCode::kFailedPrecondition;
        over_ = absl::Status(code, StrCat("etcd: watch of '", key_, "' on ", member.name,
                                          ": cancelled by etcd: ", reason));
        context.TryCancel();
        break;
      }
      if (response.created()) {
        confirmed = true;
        if (next_revision_ == 0) next_revision_ = response.header().revision() + 1;
        if (response.events_size() == 0) continue;
      }
      WatchResponse out;
      out.revision = response.header().revision();
      for (const mvccpb::Event& event : response.events()) {
        // A resumed stream starts at next_revision_, so nothing earlier should come; drop it if
        // it does rather than deliver an event twice.
        if (event.kv().mod_revision() < next_revision_) continue;
        WatchEvent e;
        e.type = event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                       : WatchEvent::Type::kPut;
        e.kv = FromProto(event.kv());
        if (event.has_prev_kv()) e.prev_kv = FromProto(event.prev_kv());
        out.events.push_back(std::move(e));
      }
      if (!out.events.empty()) {
        next_revision_ = out.events.back().kv.mod_revision + 1;
      } else if (response.events_size() == 0) {
        out.progress_notify = true;
        next_revision_ = std::max(next_revision_, out.revision + 1);
      } else {
        continue;  // only duplicates
      }
      queue_.push_back(std::move(out));
    }
    {
      MutexLock lock(&mu_);
      stream_done = true;
    }
    probe.join();
  }
  grpc::Status status = stream->Finish();
  MutexLock lock(&mu_);
  context_ = nullptr;
  member_.clear();
  if (!cancelled_ && over_.ok()) {
    if (ended.empty()) ended = status.ok() ? "the member closed the stream" : Describe(status);
    Log().log(quiet ? spdlog::level::debug : spdlog::level::warn,
              "etcd: watch of '{}' on {} ended ({}); resuming from revision {} on the next member",
              key_, member.name, ended, next_revision_);
  }
  return confirmed;
}

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

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key: etcd's "\0" range end
}

Compare Compare::Version(std::string key, Result result, int64_t version) {
  return Compare{std::move(key), Target::kVersion, result, version, {}};
}
Compare Compare::CreateRevision(std::string key, Result result, int64_t revision) {
  return Compare{std::move(key), Target::kCreateRevision, result, revision, {}};
}
Compare Compare::ModRevision(std::string key, Result result, int64_t revision) {
  return Compare{std::move(key), Target::kModRevision, result, revision, {}};
}
Compare Compare::Value(std::string key, Result result, std::string value) {
  return Compare{std::move(key), Target::kValue, result, 0, std::move(value)};
}
Compare Compare::Lease(std::string key, Result result, int64_t lease) {
  return Compare{std::move(key), Target::kLease, result, lease, {}};
}

TxnOp TxnOp::Get(std::string key, std::string range_end) {
  TxnOp op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}
TxnOp TxnOp::Put(std::string key, std::string value, int64_t lease) {
  TxnOp op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}
TxnOp TxnOp::Delete(std::string key, std::string range_end) {
  TxnOp op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

std::optional<int64_t> CompactRevisionOf(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kOutOfRange) return std::nullopt;
  auto payload = status.GetPayload(kCompactPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  return std::stoll(std::string(*payload));
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdClientOptions& options) {
  CONNEX_ASSIGN_OR_RETURN(std::vector<EtcdEndpoint> endpoints, ParseEtcdAddress(options.address));
  if (options.attempt_timeout <= absl::ZeroDuration() ||
      options.call_timeout < options.attempt_timeout) {
    return absl::InvalidArgumentError(StrCat("etcd: attempt timeout ",
                                             absl::FormatDuration(options.attempt_timeout),
                                             " must be positive and at most the call timeout ",
                                             absl::FormatDuration(options.call_timeout)));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls.enabled()) {
    if (options.tls.cert_file.empty() != options.tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          "etcd TLS: a client certificate needs both its certificate file and its key file");
    }
    grpc::SslCredentialsOptions ssl;
    CONNEX_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(options.tls.ca_file, "CA"));
    if (!options.tls.cert_file.empty()) {
      CONNEX_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                              ReadPemFile(options.tls.cert_file, "client certificate"));
      CONNEX_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile(options.tls.key_file, "client key"));
    }
    credentials = grpc::SslCredentials(ssl);
  } else if (!options.tls.cert_file.empty() || !options.tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd TLS: a client certificate without a CA file (set the CA to speak TLS)");
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  if (options.user.empty() && !options.password.empty()) {
    return absl::InvalidArgumentError("etcd auth: a password without a user");
  }
  auto client = std::make_unique<EtcdClientImpl>(options, std::move(endpoints), credentials);
  if (!options.user.empty()) {
    CONNEX_RETURN_IF_ERROR(
        Annotate(client->Authenticate(), StrCat("etcd auth as user '", options.user, "'")));
  }
  return std::unique_ptr<EtcdClient>(std::move(client));
}

}  // namespace connex::directory::etcd
