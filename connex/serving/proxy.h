// ResumeProxy: the front door of a served model. It speaks the same OpenAI-compatible API as a
// stage 0 (docs/serving.md), balances requests across the model's stage-0 replicas (the least
// busy first), and when a replica dies before or during a response — connection refused or reset,
// the stream cut before its end, a server error, silence past the idle timeout — resumes the
// request on another replica with the prompt plus the token ids already delivered and
// `max_tokens` reduced by as many. The client sees one uninterrupted, duplicate-free response
// (streamed or not): every upstream attempt is streamed, and the proxy writes its own chunks,
// under one response id. Sampling is keyed by (seed, absolute position) on the stages, so a
// resumed request produces exactly the tokens of an undisturbed run; a request without a seed
// is given one here, before its first attempt, so it too survives a resume exactly.
//
// Retries are bounded in time and in attempts: an outage (from the first failure with no token
// delivered since) may last `retry_budget_ms`, a request may make `max_attempts` attempts. While
// no replica is reachable a request waits (backing off, and woken when the replica set changes),
// which spans the restart of the only replica. A client that goes away cancels its request; a
// cancel is never retried. An error a replica answers before streaming (a 4xx) is the client's
// answer, as the replica gave it.
//
// Replicas come from SetReplicas; WatchReplicas (below) feeds them from the directory's live
// view of the model's stage-0 records (their metadata "http"), and SetChainProblem from the
// whole model's view (a stage with no live replica makes /health 503). Thread-safe.
#ifndef CONNEX_SERVING_PROXY_H_
#define CONNEX_SERVING_PROXY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/directory/client.h"
#include "connex/serving/http_server.h"

namespace connex::serving {

// The options are connex-proxy's flags; docs/configuration.md names their variables.
struct ProxyOptions {
  std::string model;  // the served model's name: what clients send and /v1/models lists
  HttpServerOptions http;
  int64_t retry_budget_ms = 10'000;    // CONNEX_PROXY_RETRY_BUDGET_MS
  int max_attempts = 20;               // CONNEX_PROXY_MAX_ATTEMPTS
  int64_t default_max_tokens = 16;     // CONNEX_DEFAULT_MAX_TOKENS, as the stages' default
  int64_t connect_timeout_ms = 2'000;  // CONNEX_PROXY_CONNECT_TIMEOUT_MS
  // An upstream that sends nothing for this long (no head, no chunk) is taken as dead.
  int64_t idle_timeout_ms = 30'000;  // CONNEX_PROXY_IDLE_TIMEOUT_MS
  // A client's stream that got nothing this long — the proxy waits for a replica, or resumes —
  // gets an SSE comment (": keep-alive"), so that the client can tell a request still served
  // from a proxy gone. 0: none. CONNEX_PROXY_STREAM_KEEPALIVE_MS.
  int64_t stream_keepalive_ms = 1'000;

  absl::Status Validate() const;  // InvalidArgument naming the bad option
};

// The response header of a streamed answer that names the replica it began on (Replica::name).
inline constexpr std::string_view kReplicaHeader = "X-Connex-Replica";

// One stage-0 replica as the proxy sees it.
struct Replica {
  std::string name;          // for logs and errors, e.g. "tiny/g0/s0/r1@3" (LID and epoch)
  std::string http_address;  // "HOST:PORT" of its API
  friend bool operator==(const Replica&, const Replica&) = default;
};

class ResumeProxy {
 public:
  // Binds options.http's address and serves. InvalidArgument for bad options, Unavailable when
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<ResumeProxy>> Start(ProxyOptions options);
  ~ResumeProxy();  // Stop()

  ResumeProxy(const ResumeProxy&) = delete;
  ResumeProxy& operator=(const ResumeProxy&) = delete;

  // Replaces the set of replicas. Requests in flight on a replica that left finish or fail there
  // (and resume elsewhere); requests waiting for a replica are woken.
  void SetReplicas(std::vector<Replica> replicas);
  std::vector<Replica> replicas() const;
  // Why the model cannot serve although stage-0 replicas exist (e.g. "no live replica of stage
  // 2"), or "" when every stage has a live replica: /health answers 503 with it while it is set.
  void SetChainProblem(std::string problem);

  // "HOST:PORT" actually bound.
  std::string address() const;
  // Stops accepting, lets responses in flight finish (the HTTP drain timeout), cancels the rest.
  // Idempotent.
  void Stop();

  struct Stats {
    int64_t requests = 0;   // completions accepted
    int64_t completed = 0;  // answered whole
    int64_t failed = 0;     // ended with an error (after every retry it was allowed)
    int64_t cancelled = 0;  // the client went away
    int64_t attempts = 0;   // upstream attempts, first ones included
    int64_t retries = 0;    // attempts after a failure
    int64_t resumes = 0;    // retries that continued a response already under way
  };
  Stats stats() const;

 private:
  class Impl;
  explicit ResumeProxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The stage-0 replicas of `model` in `view` that publish an API (metadata "http").
std::vector<Replica> StageZeroReplicas(const std::vector<directory::Record>& view,
                                       std::string_view model);

// Why `model` cannot serve in `view` ("no live replica of stage 2 (of 4)"), or "" when every
// stage it declares (records' metadata "stages") has a live replica.
std::string ChainProblem(const std::vector<directory::Record>& view, std::string_view model);

// Watches `model` in the directory and keeps `proxy`'s replicas equal to its live stage-0
// replicas, from now on (events, including those after a directory restart). Returns the
// subscription id (DirectoryClient::Unsubscribe); both must outlive it.
absl::StatusOr<uint64_t> WatchReplicas(directory::DirectoryClient& directory,
                                       const std::string& model, ResumeProxy& proxy);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_PROXY_H_
