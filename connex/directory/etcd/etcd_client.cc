// EtcdClient's connection (the class is internal/etcd_client_impl.h): one gRPC channel per member,
// the failover of a call across them (Call, in the header), the auth token, a member's Status, and
// Connect, which checks the options and reads the TLS files. KV calls are in etcd_kv.cc, leases
// in etcd_lease.cc, watches in etcd_watch.cc.
#include "connex/directory/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/internal/etcd_client_impl.h"

namespace connex::directory::etcd {
namespace client_internal {
namespace {

// etcd's metadata keys (clientv3's rpctypes): the auth token, and "refuse me unless you have a
// leader" — so that a member cut off from the quorum fails our calls and streams (and we move
// on) instead of serving stale reads or a watch that never sees another event.
constexpr char kTokenKey[] = "token";
constexpr char kRequireLeaderKey[] = "hasleader";

// A member answers a call whose deadline (ours, which gRPC sends along) ran out on its side —
// waiting for a leader or a quorum — with UNKNOWN "context deadline exceeded" (etcd passes the
// context's error through): that is our deadline, not a refusal.
grpc::StatusCode EffectiveCode(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNKNOWN &&
      status.error_message().find("context deadline exceeded") != std::string::npos) {
    return grpc::StatusCode::DEADLINE_EXCEEDED;
  }
  return status.error_code();
}

}  // namespace

absl::StatusCode CodeOf(const grpc::Status& status) {
  return static_cast<absl::StatusCode>(EffectiveCode(status));
}

std::string Describe(const grpc::Status& status) {
  std::string text = status.error_message();
  if (text.empty()) text = "no message";
  return StrCat(text, " (", absl::StatusCodeToString(CodeOf(status)), ")");
}

bool MovesOn(const grpc::Status& status) {
  const grpc::StatusCode code = EffectiveCode(status);
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

EtcdClientImpl::EtcdClientImpl(const EtcdClientOptions& options,
                               std::vector<EtcdEndpoint> endpoints,
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

absl::Status EtcdClientImpl::Authenticate() {
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

absl::StatusOr<MemberStatus> EtcdClientImpl::Status(size_t index) {
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

void EtcdClientImpl::AddMetadata(grpc::ClientContext* context, bool with_token) {
  context->AddMetadata(kRequireLeaderKey, "true");
  if (!with_token) return;
  MutexLock lock(&mu_);
  if (!token_.empty()) context->AddMetadata(kTokenKey, token_);
}

}  // namespace client_internal

namespace {

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

}  // namespace

using client_internal::EtcdClientImpl;

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
