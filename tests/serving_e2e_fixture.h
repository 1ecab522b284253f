// The fixture of the serving e2e tests (label e2e): a deployment started with connex-chaos's
// Cluster, the harness of its campaigns — a directory, two replica chains of a three-stage
// pipeline of the reference engine (connex-stage), stage 0 of each serving the OpenAI-compatible
// API, and the resume proxy (connex-proxy) — and connex-chaos's check of a completion against
// connex-generate's (chaos::Check), the one definition of a correct completion. Each test gets a
// deployment of its own; the model is made once per suite. Confined to the test's thread.
#ifndef CONNEX_TESTS_SERVING_E2E_FIXTURE_H_
#define CONNEX_TESTS_SERVING_E2E_FIXTURE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "connex/chaos/cluster.h"
#include "connex/chaos/load.h"
#include "connex/chaos/reference.h"
#include "gtest/gtest.h"

namespace connex::testing {

inline constexpr int kStages = 3;
inline constexpr char kModelName[] = "tiny";

// Streamed completions, each on a thread of its own (chaos::Load, as the campaigns stream them),
// joined when it goes (an ASSERT may leave a test while they run).
class Streams {
 public:
  Streams() = default;
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  ~Streams() { load_.Wait(); }
  // Streams `spec` from `at` (`target` names it in failures); its outcome, whose `live` says how
  // far it is, and whose `result` is there once it ended (after Wait()).
  std::shared_ptr<chaos::Outcome> Start(const chaos::RequestSpec& spec, const chaos::HostPort& at,
                                        const std::string& target);
  // Whether every stream has `n` tokens or has ended within `timeout_ms`.
  bool WaitForTokens(int n, int64_t timeout_ms = 60'000);
  // Waits for every stream to end; their outcomes.
  std::vector<std::shared_ptr<chaos::Outcome>> Wait() { return load_.Wait(); }

 private:
  chaos::Load load_;
  uint64_t next_ = 0;
};

class ServingE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;
  void TearDown() override;
  // A test's changes to the deployment (the fixture's options, above, come first).
  virtual void Configure(chaos::ClusterOptions& /*options*/) {}

  static std::string ModelPath();
  chaos::Cluster& cluster() { return *cluster_; }
  // This test's folder (the deployment's logs, connex-generate's prompts).
  const std::string& work_dir() const { return work_dir_; }
  chaos::HostPort api(int replica) const { return cluster_->api(replica); }
  uint16_t http_port(int replica) const { return cluster_->api(replica).port; }
  // Where stage (stage, replica) serves /metrics (stage 0: its API).
  uint16_t metrics_port(int stage, int replica) const {
    return cluster_->metrics(stage, replica).port;
  }
  chaos::HostPort proxy() const { return *cluster_->proxy(); }
  uint16_t proxy_port() const { return cluster_->proxy()->port; }

  // The proxy's metric `name` (0 when absent, -1 when it does not answer).
  double ProxyMetric(const std::string& name);
  int ProxyReplicas() { return static_cast<int>(ProxyMetric("connex_proxy_replicas")); }
  // The sum of every series of metric `name` (any labels) on the /metrics at `port`.
  static double MetricSum(uint16_t port, const std::string& name);
  // MetricSum over both stage 0s.
  double StageZeroSum(const std::string& name) {
    return MetricSum(http_port(0), name) + MetricSum(http_port(1), name);
  }
  // What some stage still holds ("" when no stage holds a request): every stage's
  // connex_stage_held_requests, and each owner's connex_stage_requests_in_flight.
  std::string HeldAnywhere();

  // A whole request to stage 0 of `replica`: its status and body (0 when it got no answer).
  std::pair<int, std::string> Request(int replica, const std::string& method,
                                      const std::string& target, const std::string& body = "");
  std::pair<int, std::string> Get(int replica, const std::string& target) {
    return Request(replica, "GET", target);
  }

  // connex-generate's answer to `spec` (chaos::References); an empty one, and a failure, when it
  // cannot be computed.
  chaos::Reference Want(const chaos::RequestSpec& spec);
  // The first of `candidate(0)`, `candidate(1)`, ... `candidate(tries - 1)` whose generation
  // runs its whole max_tokens (no EOS), so that a fault lands mid-response; the reference is
  // deterministic, so the choice is too. nullopt (and a failure) when none does.
  std::optional<chaos::RequestSpec> RunningFullLength(
      const std::function<chaos::RequestSpec(int)>& candidate, int tries);
  // The outcome of a whole (non-streamed) completion of `spec` answered with `status` and
  // `body`, as chaos::Check reads a completed request.
  static std::shared_ptr<chaos::Outcome> WholeOutcome(const chaos::RequestSpec& spec,
                                                      const std::string& target, int status,
                                                      const std::string& body);
  // chaos::Check of every outcome: each completed, identical to connex-generate's answer (token
  // ids, text, finish_reason, usage, one response id).
  void ExpectCorrect(std::vector<std::shared_ptr<chaos::Outcome>> outcomes);

 private:
  void PrintLogs();

  static std::string* dir_;
  std::string work_dir_;
  std::unique_ptr<chaos::Cluster> cluster_;
  std::optional<chaos::References> references_;
};

}  // namespace connex::testing

#endif  // CONNEX_TESTS_SERVING_E2E_FIXTURE_H_
