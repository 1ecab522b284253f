// What every campaign of connex-chaos shares: the requests of its load (SpecFor), the load
// generator that streams them (Load), the exactness check against connex-generate (Check) — the
// one definition of a correct completion — and the pieces of a record (totals, latencies,
// failures). Load is thread-safe; the free functions are stateless.
#ifndef CONNEX_CHAOS_LOAD_H_
#define CONNEX_CHAOS_LOAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "connex/base/mutex.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/cluster.h"
#include "connex/chaos/http_client.h"
#include "connex/chaos/reference.h"
#include "nlohmann/json.hpp"

namespace connex::chaos {

inline constexpr int64_t kIdleTimeoutMs = 60'000;  // a client waits this long for any byte

// Request i of a campaign: prompt i of a fixed list + " #i"; odd requests are sampled
// (temperature 0.8, seed 7, 42 or 1234), even ones greedy; i % 4 == 2 with a repetition penalty
// (1.15), i % 4 == 3 with min_p 0.05 and top_p 0.95.
RequestSpec SpecFor(uint64_t i, int max_tokens);

// A progress line on stderr, unless `o.progress` is off.
void Progress(const CommonOptions& o, const std::string& line);

double Ms(int64_t ns);
// `v` with one decimal ("12.3"), for reports.
std::string F1(double v);
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

// A request while it streams, for a campaign that acts on what is in flight (Load writes it as
// tokens arrive). Thread-safe.
class LiveStream {
 public:
  struct View {
    bool started = false, ended = false;
    int64_t start_ns = 0, end_ns = 0;
    int tokens = 0;
    // Whether it was under way at `t_ns` (sent, not ended).
    bool RunningAt(int64_t t_ns) const {
      return started && start_ns <= t_ns && (!ended || end_ns > t_ns);
    }
  };
  void Started(int64_t ns);
  void Token(int64_t at_ns);
  void Ended(int64_t ns);
  View Get() const;
  // The arrival of its first token after `t_ns`; nullopt when none came yet.
  std::optional<int64_t> FirstTokenAfter(int64_t t_ns) const;

 private:
  mutable connex::Mutex mu_;
  View view_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> token_ns_ ABSL_GUARDED_BY(mu_);
};

// One request as issued and as it went.
struct Outcome {
  uint64_t index = 0;
  RequestSpec spec;
  std::string target;   // "proxy" or "replica N"
  int replica = -1;     // when sent to a replica directly
  StreamResult result;  // once it ended (live.Get().ended, or after Load::Wait)
  LiveStream live;
  // Check(): completed and identical to connex-generate's answer — token ids, text, the
  // finish_reason they imply, usage and a single response id.
  bool correct = false;
  Comparison comparison;                 // of the token ids
  std::vector<std::string> differences;  // what else differs; empty when correct
};

// What differs in a completed request that is not correct (Check first), for a problem line.
std::string Differences(const Outcome& o);

// The load generator. Issue() runs one request on a thread of its own; StartClients() runs
// closed-loop clients. Wait() joins every request (clients first stop, StopClients()).
// Thread-safe.
class Load {
 public:
  void Issue(uint64_t index, RequestSpec spec, HostPort at, std::string target, int replica,
             int64_t timeout_ms);
  // `clients` threads, each streaming one request after another, `pause_ms` apart, until
  // StopClients(): request i (one count over every client) is `spec(i)`, sent to
  // `target(client)` (where, and its name for the record).
  void StartClients(int clients, std::function<RequestSpec(uint64_t)> spec,
                    std::function<std::pair<HostPort, std::string>(int client)> target,
                    int64_t pause_ms, int64_t timeout_ms);
  // Called from one thread (the campaign's).
  void StopClients() {
    if (!stop_clients_.HasBeenNotified()) stop_clients_.Notify();
  }
  void set_model(std::string model) { model_ = std::move(model); }
  // Whether every request issued so far has `n` tokens or has ended.
  bool AllHaveTokens(int n);
  size_t issued();
  size_t done() const { return done_.load(); }
  // Every request issued so far, ended or not (read a running one through its `live`).
  std::vector<std::shared_ptr<Outcome>> Outcomes();
  std::vector<std::shared_ptr<Outcome>> Wait();

 private:
  std::shared_ptr<Outcome> Add(uint64_t index, RequestSpec spec, std::string target, int replica);
  void Run(Outcome& o, const HostPort& at, int64_t timeout_ms);

  std::mutex mu_;
  std::string model_ = "tiny";
  std::vector<std::shared_ptr<Outcome>> outcomes_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> done_{0};
  std::atomic<uint64_t> next_client_index_{0};
  absl::Notification stop_clients_;
};

// Compares every completed request with connex-generate's answer to the same prompt, max_tokens
// and sampling; fills `correct`, `comparison` and `differences`. The one definition of a correct
// completion for every campaign.
absl::Status Check(const CommonOptions& o, const std::string& model_path,
                   std::vector<std::shared_ptr<Outcome>>& outcomes);
// The same with the references of `refs`, which computes those it lacks (for a caller that
// chose its requests by their references, as the serving e2e tests do).
absl::Status Check(References& refs, std::vector<std::shared_ptr<Outcome>>& outcomes);

// Totals over a set of outcomes: issued, completed, failed, correct, differing (completed, not
// correct), tokens compared and mismatched.
nlohmann::json Totals(const std::vector<std::shared_ptr<Outcome>>& outcomes);
// A problem line when some completions of `totals` are not correct.
void AddDifferingProblem(const nlohmann::json& totals, std::vector<std::string>& problems);
// End-to-end, TTFT and per-token latency of the completed ones, and their tokens.
nlohmann::json Latencies(const std::vector<std::shared_ptr<Outcome>>& outcomes);
// A failed request, for a record's "failures".
nlohmann::json Failure(const Outcome& o);

}  // namespace connex::chaos

#endif  // CONNEX_CHAOS_LOAD_H_
