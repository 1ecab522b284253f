// A deployment across namespace hosts (tests/multihost_deployment.h: etcd with TLS on three
// hosts, two chains spread so that no host holds one whole, the proxy on a host of its own,
// CURVE keys everywhere) under faults across hosts. Each test runs closed-loop clients through
// the proxy, faults a host while they stream, and checks every completion against
// connex-generate (token ids, text, usage); the figures — fault to next token, goodput,
// steady-state throughput and latency — are printed (docs/results.md), never asserted on time.
// Label hosts.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/chaos/load.h"
#include "gtest/gtest.h"
#include "tests/multihost_deployment.h"

namespace connex::testing {
namespace {

using chaos::Outcome;
using nlohmann::json;

constexpr int kClients = 4;
constexpr int kMaxTokens = 24;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What one phase of load saw.
struct Phase {
  std::vector<std::shared_ptr<Outcome>> outcomes;
  json totals, latencies;
  double seconds = 0;
  std::vector<double> next_token_ms;  // per request running at the fault
  // Per request with a wait that ended after the fault: its longest wait for a token (from its
  // start to its first token, or between two tokens) among those — what a client felt.
  std::vector<double> longest_wait_ms;
  double tokens_per_s() const {
    return latencies["tokens"].get<double>() / std::max(seconds, 1e-9);
  }
};

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = chaos::Hosts::Available(); !s.ok()) {
      GTEST_SKIP() << "namespace hosts cannot be made here: " << s.message();
    }
    for (const char* tool : {"/usr/bin/etcd", "/usr/bin/etcdctl", "/usr/bin/openssl"}) {
      if (access(tool, X_OK) != 0) GTEST_SKIP() << tool << " is missing (scripts/install-deps.sh)";
    }
    dir_ = StrCat(::testing::TempDir(), "/multihost-", getpid(), "-",
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    MultiHostOptions o;
    o.work_dir = dir_;
    absl::StatusOr<std::unique_ptr<MultiHostDeployment>> d = MultiHostDeployment::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    d_ = std::move(*d);
    refs_ = std::make_unique<chaos::References>(BinDir() + "/connex-generate", d_->model_path(),
                                                MultiHostDeployment::kStages, dir_);
  }
  void TearDown() override {
    d_.reset();
    // Logs stay after a failure, or when asked (CONNEX_HOSTS_KEEP=1).
    const char* keep = std::getenv("CONNEX_HOSTS_KEEP");
    if (!HasFailure() && !(keep != nullptr && std::string(keep) == "1")) {
      std::filesystem::remove_all(dir_);
    } else {
      std::printf("logs kept in %s\n", dir_.c_str());
    }
  }

  // Clients stream through the proxy; `fault` runs once every client has tokens flowing (its
  // time is the fault's), then the load goes on until `after` more requests completed (at
  // least `min_seconds`). Checks every completion.
  Phase RunLoad(const std::function<void()>& fault, int after, double min_seconds) {
    chaos::Load load;
    load.set_model("tiny");
    const chaos::HostPort proxy = d_->proxy();
    const int64_t start = NowNs();
    load.StartClients(
        kClients, [](uint64_t i) { return chaos::SpecFor(i, kMaxTokens); },
        [&](int) { return std::make_pair(proxy, std::string("proxy")); }, 0, 120'000);
    Phase p;
    EXPECT_TRUE(
        WaitUntil([&] { return load.issued() >= kClients && load.AllHaveTokens(2); }, 60'000, 5));
    int64_t t_fault = 0;
    if (fault) {
      t_fault = NowNs();
      fault();
    }
    const size_t done_at_fault = load.done();
    EXPECT_TRUE(WaitUntil(
        [&] {
          return load.done() >= done_at_fault + static_cast<size_t>(after) &&
                 NowNs() - start >= static_cast<int64_t>(min_seconds * 1e9);
        },
        180'000, 20))
        << "the load stalled after the fault";
    load.StopClients();
    p.outcomes = load.Wait();
    p.seconds = static_cast<double>(NowNs() - start) / 1e9;
    if (fault) {
      for (const auto& o : p.outcomes) {
        if (!o->live.Get().RunningAt(t_fault)) continue;
        if (std::optional<int64_t> next = o->live.FirstTokenAfter(t_fault)) {
          p.next_token_ms.push_back(static_cast<double>(*next - t_fault) / 1e6);
        }
      }
      for (const auto& o : p.outcomes) {
        const chaos::StreamResult& r = o->result;
        int64_t prev = r.start_ns, longest = -1;
        for (int64_t t : r.token_ns) {
          if (t > t_fault) longest = std::max(longest, t - prev);
          prev = t;
        }
        if (longest >= 0) p.longest_wait_ms.push_back(static_cast<double>(longest) / 1e6);
      }
    }
    absl::Status checked = chaos::Check(*refs_, p.outcomes);
    EXPECT_TRUE(checked.ok()) << checked;
    p.totals = chaos::Totals(p.outcomes);
    p.latencies = chaos::Latencies(p.outcomes);
    return p;
  }
  // 100 % goodput: every request issued completed, each exactly as connex-generate answers.
  void ExpectAllExact(const std::string& what, const Phase& p) {
    EXPECT_EQ(p.totals["failed"].get<int64_t>(), 0) << what << ": " << p.totals.dump();
    EXPECT_EQ(p.totals["correct"].get<int64_t>(), p.totals["issued"].get<int64_t>())
        << what << ": " << p.totals.dump();
    EXPECT_EQ(p.totals["mismatched_tokens"].get<int64_t>(), 0) << what;
    for (const auto& o : p.outcomes) {
      if (!o->result.ok()) ADD_FAILURE() << what << ": " << chaos::Failure(*o).dump();
    }
  }
  void Report(const std::string& what, const Phase& p) {
    json r = {{"case", what},
              {"seconds", p.seconds},
              {"totals", p.totals},
              {"goodput",
               p.totals["correct"].get<double>() / std::max(1.0, p.totals["issued"].get<double>())},
              {"tokens_per_s", p.tokens_per_s()},
              {"latency", p.latencies}};
    if (!p.next_token_ms.empty()) r["fault_to_next_token_ms"] = chaos::Dist(p.next_token_ms);
    if (!p.longest_wait_ms.empty()) {
      r["longest_wait_for_a_token_after_fault_ms"] = chaos::Dist(p.longest_wait_ms);
    }
    std::printf("hosts figure: %s\n", r.dump().c_str());
    std::fflush(stdout);
  }
  // Per-epoch step counters of a stage's /metrics: the last step it ran under `epoch`
  // (CLOCK_MONOTONIC ns), or nullopt when it reports none.
  std::optional<int64_t> LastStepUnder(uint32_t stage, uint32_t replica, uint64_t epoch) {
    absl::StatusOr<std::map<std::string, double>> m = d_->Metrics(stage, replica);
    if (!m.ok()) return std::nullopt;
    auto it =
        m->find(StrCat("connex_stage_epoch_last_step_monotonic_seconds{epoch=\"", epoch, "\"}"));
    if (it == m->end()) return std::nullopt;
    return static_cast<int64_t>(it->second * 1e9);
  }

  std::string dir_;
  std::unique_ptr<MultiHostDeployment> d_;
  std::unique_ptr<chaos::References> refs_;
};

// Steady state on clean links, then with 5 ms RTT (2.5 ms each way, on every host) and 1 % loss
// on every link, in the same run.
TEST_F(MultiHostTest, ExactTokensOnCleanAndOnDelayedLossyLinks) {
  Phase clean = RunLoad(nullptr, 24, 10);
  ExpectAllExact("clean links", clean);
  Report("steady, clean links", clean);
  for (int h = 0; h < MultiHostDeployment::kHosts; ++h) {
    absl::Status s = d_->hosts().SetDelay(h, 2500);
    if (absl::IsFailedPrecondition(s)) GTEST_SKIP() << s.message();
    ASSERT_TRUE(s.ok()) << s;
  }
  Phase delayed = RunLoad(nullptr, 24, 10);
  ExpectAllExact("5 ms RTT", delayed);
  Report("steady, 5 ms RTT on every link", delayed);
  for (int h = 0; h < MultiHostDeployment::kHosts; ++h) {
    ASSERT_TRUE(d_->hosts().SetLoss(h, 0.01).ok());
  }
  Phase lossy = RunLoad(nullptr, 24, 10);
  ExpectAllExact("5 ms RTT, 1 % loss", lossy);
  Report("steady, 5 ms RTT and 1 % loss on every link", lossy);
}

// Host 1 holds stage 0 of chain 0, stage 1 of chain 1 and an etcd member: lost whole.
TEST_F(MultiHostTest, AHostHoldingOneStageOfEachChainLostWhole) {
  // The etcd leader's loss is a case of its own (below): here it leads from host 3.
  ASSERT_TRUE(d_->MoveEtcdLeader(3).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<int> l = d_->EtcdLeaderHost();
        return l.ok() && *l == 3;
      },
      10'000, 50));
  Phase p = RunLoad([&] { ASSERT_TRUE(d_->hosts().Lose(1).ok()); }, 2 * kClients, 8);
  ExpectAllExact("host 1 lost", p);
  Report("host 1 (s0 of chain 0, s1 of chain 1, etcd e1) lost whole", p);
  EXPECT_FALSE(p.next_token_ms.empty());
  // The data plane: s1r0 (host 2) read its own chain's stage 0 on host 1 over tcp, and after the
  // loss chain 1's stage 0, on its own host, over shm (each host has a host name of its own).
  std::ifstream log(StrCat(dir_, "/stage-1-r0.log"));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("transport auto: tiny/g0/s0/r0 via tcp"), std::string::npos)
      << "s1r0 did not read s0r0 (another host) over tcp; see " << dir_ << "/stage-1-r0.log";
  EXPECT_NE(text.find("transport auto: tiny/g0/s0/r1 via shm"), std::string::npos)
      << "s1r0 did not read s0r1 (its own host) over shm; see " << dir_ << "/stage-1-r0.log";
}

// Host 2 cut off (its processes alive) for longer than a lease, then back: its stages were
// replaced (FAILED, new epochs when they rejoin) and ran nothing under their old epochs once
// back; no completion differs.
TEST_F(MultiHostTest, AHostCutOffAndBackIsFenced) {
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> before;
  for (auto [s, r] : {std::pair<uint32_t, uint32_t>{1, 0}, {0, 1}}) {
    absl::StatusOr<uint64_t> e = d_->DirectoryEpoch(s, r);
    ASSERT_TRUE(e.ok() && *e > 0) << e.status();
    before[{s, r}] = *e;
  }
  int64_t t_heal = 0;
  Phase p = RunLoad(
      [&] {
        ASSERT_TRUE(d_->hosts().Cut(2).ok());
        // Long enough for both their leases to run out (2 s): each record FAILED or replaced.
        EXPECT_TRUE(WaitUntil(
            [&] {
              for (auto [key, old] : before) {
                absl::StatusOr<uint64_t> e = d_->DirectoryEpoch(key.first, key.second);
                if (!e.ok() || *e == old) return false;
              }
              return true;
            },
            30'000, 100));
        ASSERT_TRUE(d_->hosts().Heal(2).ok());
        t_heal = NowNs();
      },
      3 * kClients, 8);
  ExpectAllExact("host 2 cut off and back", p);
  Report("host 2 (s1 of chain 0, s0 of chain 1, etcd e2) cut off, then back", p);
  // Back: both rejoin under new epochs, and serve again.
  for (const auto& entry : before) {
    // Copies, not structured bindings: clang 14 cannot capture those in a lambda.
    const std::pair<uint32_t, uint32_t> key = entry.first;
    const uint64_t old = entry.second;
    uint64_t now = 0;
    EXPECT_TRUE(WaitUntil(
        [&] {
          absl::StatusOr<uint64_t> e = d_->DirectoryEpoch(key.first, key.second);
          now = e.ok() ? *e : 0;
          return now != 0 && now != old;
        },
        30'000, 100))
        << "stage " << key.first << "/r" << key.second << " never rejoined";
    std::optional<int64_t> last = LastStepUnder(key.first, key.second, old);
    ASSERT_TRUE(last.has_value()) << "stage " << key.first << "/r" << key.second
                                  << " reports no steps under epoch " << old;
    EXPECT_LT(*last, t_heal) << "stage " << key.first << "/r" << key.second
                             << " ran a step under its replaced epoch " << old
                             << " after it was back";
    std::printf(
        "stage %u/r%u: epoch %llu -> %llu; last step under the old one %.0f ms before "
        "the heal\n",
        key.first, key.second, static_cast<unsigned long long>(old),
        static_cast<unsigned long long>(now), static_cast<double>(t_heal - *last) / 1e6);
  }
  EXPECT_TRUE(WaitUntil([&] { return d_->Healthy(MultiHostDeployment::kReplicas); }, 60'000, 50));
}

// The etcd leader moved to host 3 (which runs nothing else), then host 3 lost whole: the
// members left elect another leader, and serving never notices.
TEST_F(MultiHostTest, TheEtcdLeadersHostLost) {
  ASSERT_TRUE(d_->MoveEtcdLeader(3).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<int> l = d_->EtcdLeaderHost();
        return l.ok() && *l == 3;
      },
      10'000, 50));
  int64_t t_lost = 0, t_leader = 0;
  int new_leader = 0;
  Phase p = RunLoad(
      [&] {
        t_lost = NowNs();
        ASSERT_TRUE(d_->hosts().Lose(3).ok());
        EXPECT_TRUE(WaitUntil(
            [&] {
              absl::StatusOr<int> l = d_->EtcdLeaderHost(/*skip_host=*/3);
              new_leader = l.ok() ? *l : 0;
              return new_leader != 0;
            },
            30'000, 20));
        t_leader = NowNs();
      },
      2 * kClients, 8);
  ExpectAllExact("etcd leader's host lost", p);
  Report("host 3 (etcd leader e3 only) lost whole", p);
  EXPECT_NE(new_leader, 3);
  std::printf("etcd: leader on host 3 lost -> host %d leads after %.0f ms\n", new_leader,
              static_cast<double>(t_leader - t_lost) / 1e6);
  // The directory still answers, and nobody was evicted.
  absl::StatusOr<uint64_t> e = d_->DirectoryEpoch(0, 0);
  EXPECT_TRUE(e.ok() && *e > 0) << e.status();
}

}  // namespace
}  // namespace connex::testing
