// What every campaign of connex-chaos shares: the requests of its load (SpecFor), the load
// generator that streams them (Load), the exactness check against connex-generate (Check) — the
// one definition of a correct completion — and the pieces of a record (totals, latencies,
// failures). Load is thread-safe; the free functions are stateless.
#ifndef CONNEX_CHAOS_LOAD_H_
#define CONNEX_CHAOS_LOAD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/cluster.h"
#include "connex/chaos/http_client.h"
#include "connex/chaos/reference.h"
#include "nlohmann/json.hpp"

namespace connex::chaos {

inline constexpr int64_t kIdleTimeoutMs = 60'000;  // a client waits this long for any byte

// Request i of a campaign: prompt i of a fixed list + " #i"; odd requests are sampled
// (temperature 0.8, seed 7, 42 or 1234), even ones greedy.
RequestSpec SpecFor(uint64_t i, int max_tokens);

// A progress line on stderr, unless `o.progress` is off.
void Progress(const CommonOptions& o, const std::string& line);

double Ms(int64_t ns);
// n, mean, p50, p90, p99 and max of `v`.
nlohmann::json Dist(const std::vector<double>& v);
// The machine a record was made on: cores and date.
nlohmann::json Machine();
nlohmann::json CommonJson(const CommonOptions& o);

// The campaign's deployment: started (with the proxy if `proxy`, K = `inflight`, each stage in a
// netns of its own if `netns`, `stage_env` added to every stage's environment), or attached to
// the one of `o.directory`.
absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(const CommonOptions& o, bool proxy,
                                                      int inflight, bool netns,
                                                      std::vector<std::string> stage_env = {});

// One request as issued and as it went.
struct Outcome {
  uint64_t index = 0;
  RequestSpec spec;
  std::string target;  // "proxy" or "replica N"
  int replica = -1;    // when sent to a replica directly
  StreamResult result;
  bool correct = false;  // completed with exactly the reference tokens
  Comparison comparison;
};

// Runs requests on their own threads; Wait() joins them.
class Load {
 public:
  void Issue(uint64_t index, RequestSpec spec, HostPort at, std::string target, int replica,
             int64_t timeout_ms);
  void set_model(std::string model) { model_ = std::move(model); }
  // Whether every request issued so far has `n` tokens or has ended.
  bool AllHaveTokens(int n);
  size_t issued();
  size_t done() const { return done_.load(); }
  std::vector<std::shared_ptr<Outcome>> Wait();

 private:
  std::mutex mu_;
  std::string model_ = "tiny";
  std::vector<std::shared_ptr<Outcome>> outcomes_;
  std::vector<std::shared_ptr<std::atomic<int>>> tokens_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> done_{0};
};

// Compares every completed request with its reference; fills `correct` and `comparison`.
absl::Status Check(const CommonOptions& o, const std::string& model_path,
                   std::vector<std::shared_ptr<Outcome>>& outcomes);

// Totals over a set of outcomes: issued, completed, failed, correct, tokens compared and
// mismatched.
nlohmann::json Totals(const std::vector<std::shared_ptr<Outcome>>& outcomes);
// End-to-end, TTFT and per-token latency of the completed ones, and their tokens.
nlohmann::json Latencies(const std::vector<std::shared_ptr<Outcome>>& outcomes);
// A failed request, for a record's "failures".
nlohmann::json Failure(const Outcome& o);

}  // namespace connex::chaos

#endif  // CONNEX_CHAOS_LOAD_H_
