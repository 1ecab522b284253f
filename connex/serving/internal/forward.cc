#include "connex/serving/internal/forward.h"

#include <memory>
#include <string>
#include <utility>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/http_client.h"
#include "connex/serving/http_server.h"
#include "connex/serving/listen_address.h"

namespace connex::serving::internal {
namespace {

// A forwarded answer larger than this is a broken replica.
constexpr size_t kMaxForwardedBytes = size_t{8} << 20;

// One POST to one replica within `timeout_ms`, the whole exchange; the failure says what broke.
absl::StatusOr<ForwardedAnswer> PostTo(const Replica& replica, const std::string& target,
                                       const std::string& body, int64_t timeout_ms) {
  HttpServerOptions parsed;
  absl::Status address = ParseListenAddress("http", replica.http_address, &parsed);
  if (!address.ok() || parsed.port == 0) {
    return absl::UnavailableError(
        StrCat(replica.name, ": its API address ", replica.http_address, " is not HOST:PORT"));
  }
  const int64_t deadline_ns = SteadyNowNs() + timeout_ms * 1'000'000;
  auto post = [&]() -> absl::StatusOr<ForwardedAnswer> {
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<HttpClientConnection> connection,
                            HttpClientConnection::Connect(parsed.host, parsed.port, deadline_ns));
    CONNEX_RETURN_IF_ERROR(connection->Send("POST", target,
                                            {StrCat("Host: ", replica.http_address)}, body,
                                            "application/json", deadline_ns));
    CONNEX_ASSIGN_OR_RETURN(HttpResponseHead head, connection->ReadHead(deadline_ns));
    CONNEX_ASSIGN_OR_RETURN(std::string answer,
                            connection->ReadBody(deadline_ns, kMaxForwardedBytes));
    return ForwardedAnswer{head.status, head.Header("Content-Type").value_or(""),
                           std::move(answer)};
  };
  absl::StatusOr<ForwardedAnswer> answer = post();
  if (!answer.ok()) {
    // Whatever broke, this replica did not answer: the next may.
    return absl::UnavailableError(StrCat(replica.name, ": ", answer.status().message()));
  }
  return answer;
}

}  // namespace

absl::StatusOr<ForwardedAnswer> ForwardToReplicas(const std::vector<Replica>& replicas,
                                                  const std::string& target,
                                                  const std::string& body, int64_t timeout_ms) {
  std::string failures;
  for (const Replica& replica : replicas) {
    absl::StatusOr<ForwardedAnswer> answer = PostTo(replica, target, body, timeout_ms);
    // A replica that is starting (503) may be followed by one that serves.
    if (answer.ok() && answer->status != 503) return answer;
    failures +=
        StrCat(failures.empty() ? "" : "; ", answer.ok() ? StrCat(replica.name, ": 503")
                                                         : std::string(answer.status().message()));
  }
  return absl::UnavailableError(
      replicas.empty() ? StrCat("no stage-0 replica is known to answer ", target)
                       : StrCat("no stage-0 replica answered ", target, " (", failures, ")"));
}

}  // namespace connex::serving::internal
