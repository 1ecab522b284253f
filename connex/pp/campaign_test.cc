// The randomized fault campaign of the step protocol: for every seed, two replica chains of a
// three-stage pipeline generate while stages are killed, restarted, drained, migrated and added,
// reads fail or slow down, signals are dropped, delayed and duplicated, and directory events
// arrive late. For every seed:
// no step runs twice on any stage; every request finishes with exactly the tokens of an
// undisturbed run, or is aborted after the re-prefill limit; no ring slot leaks; no request
// outlives a bound. CONNEX_TEST_SEEDS sets the number of seeds (default 200), CONNEX_TEST_SEED
// runs one seed.
#include <random>

#include "connex/base/config.h"
#include "connex/base/wait.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/pp/testing/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using testing::Cluster;
using testing::ReferenceTokens;

constexpr uint32_t kStages = 3;
constexpr int64_t kRequestBoundMs = 30000;

struct Plan {
  std::vector<int32_t> prompt;
  int max_new = 0;
};

std::vector<int32_t> RandomPrompt(std::mt19937_64& rng) {
  std::vector<int32_t> p(1 + rng() % 12);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 200);
  return p;
}

// Runs one seed; returns a description of what went wrong, or "" when all held.
std::string RunSeed(directory::DirectoryServer& server, uint64_t seed, std::string* summary) {
  std::mt19937_64 rng(seed * 7919 + 1);
  StageNodeOptions o;
  o.step_timeout_ms = 120 + static_cast<int64_t>(rng() % 100);
  o.probe_timeout_ms = 80;
  o.inflight = 1 + static_cast<int>(rng() % 4);
  o.max_batch = 1 + static_cast<int>(rng() % 6);
  o.ring_slots = 2 + static_cast<int>(rng() % 8);
  o.slot_bytes = 1 << 16;
  o.reprefill_max = 8;
  o.route_wait_ms = 20000;
  Cluster c(server, "c" + std::to_string(seed), kStages, seed, o);
  for (uint32_t r = 0; r < 2; ++r) {
    for (uint32_t s = 0; s < kStages; ++s) {
      if (c.Start(s, r) == nullptr) return "a node did not start";
    }
  }
  // Owners must see both chains before they route.
  auto watcher = directory::testing::ConnectTo(server);
  if (!watcher.ok() || !(*watcher)->Watch(c.model()).ok() ||
      !(*watcher)->AwaitView(
          c.model(), [](const auto& v) { return v.size() == 2 * kStages; }, 5000)) {
    return "the directory did not show both chains";
  }

  SignalFaults faults;
  faults.drop = (rng() % 3 == 0) ? 0.02 * static_cast<double>(rng() % 3) : 0;
  faults.duplicate = (rng() % 2 == 0) ? 0.05 * static_cast<double>(rng() % 3) : 0;
  faults.delay = (rng() % 2 == 0) ? 0.1 * static_cast<double>(rng() % 3) : 0;
  faults.max_delay_ms = 1 + static_cast<int>(rng() % 30);
  c.signals().SetFaults(faults);
  if (rng() % 3 == 0) c.SetDirectoryEventDelay(1 + static_cast<int>(rng() % 40));

  std::map<uint64_t, Plan> plans;
  const int requests = 4 + static_cast<int>(rng() % 5);
  for (int i = 0; i < requests; ++i) {
    uint64_t id = seed * 1000 + static_cast<uint64_t>(i);
    Plan p{RandomPrompt(rng), 10 + static_cast<int>(rng() % 50)};
    plans[id] = p;
    if (!c.Submit(static_cast<uint32_t>(i % 2), id, p.prompt, p.max_new).ok())
      return "submit failed";
  }

  // Faults at points of progress (not of time), so that a seed does the same things each run.
  const int actions = 2 + static_cast<int>(rng() % 4);
  uint64_t progress = 0;
  std::vector<std::string> did;
  for (int a = 0; a < actions; ++a) {
    progress += 5 + rng() % 40;
    uint64_t target = progress;
    if (!WaitUntil([&] { return c.TotalStats().steps_executed >= target; }, 3000)) break;
    uint32_t stage = 1 + static_cast<uint32_t>(rng() % (kStages - 1));
    uint32_t replica = static_cast<uint32_t>(rng() % 3);
    uint32_t other = replica == 0 ? 1 : 0;
    // Keep one live replica per stage: without one, requests could only wait.
    bool other_alive = c.alive(stage, other) || (replica != 2 && c.alive(stage, 2));
    switch (rng() % 6) {
      case 0:
        if (c.alive(stage, replica) && other_alive) {
          c.Kill(stage, replica);
          did.push_back("kill " + std::to_string(stage) + "/" + std::to_string(replica));
        }
        break;
      case 1:
        if (!c.alive(stage, replica)) {
          c.Start(stage, replica);
          did.push_back("restart " + std::to_string(stage) + "/" + std::to_string(replica));
        }
        break;
      case 2:
        if (c.alive(stage, replica) && other_alive) {
          c.Leave(stage, replica);
          did.push_back("leave " + std::to_string(stage) + "/" + std::to_string(replica));
        }
        break;
      case 3:
        if (c.alive(stage, replica) && c.Migrate(stage, replica).ok()) {
          did.push_back("migrate " + std::to_string(stage) + "/" + std::to_string(replica));
        }
        break;
      case 4:
        if (!c.alive(stage, 2)) {
          c.Start(stage, 2);
          did.push_back("join " + std::to_string(stage) + "/2");
        }
        break;
      case 5: {
        Lid lid{c.model(), stage, 0, replica};
        if (rng() % 2 == 0) {
          c.fabric().FailNextReads(lid, 1 + static_cast<int>(rng() % 3));
          did.push_back("fail-reads " + std::to_string(stage) + "/" + std::to_string(replica));
        } else {
          c.fabric().SetReadDelay(lid, 1 + static_cast<int>(rng() % 5));
          did.push_back("slow-reads " + std::to_string(stage) + "/" + std::to_string(replica));
        }
        break;
      }
    }
  }
  std::string what;
  for (const std::string& d : did) what += d + ", ";
  *summary = what;

  if (!c.AwaitAll(kRequestBoundMs))
    return "a request did not finish within the bound (" + what + ")";
  for (const auto& [id, outcome] : c.outcomes()) {
    if (outcome.tokens.ok()) {
      std::vector<int32_t> want = ReferenceTokens(kStages, plans[id].prompt, plans[id].max_new);
      if (*outcome.tokens != want)
        return "request " + std::to_string(id) + " diverged (" + what + ")";
      if (outcome.streamed != want || outcome.streamed_after_done)
        return "request " + std::to_string(id) + " streamed other tokens than it returned (" +
               what + ")";
    } else if (outcome.tokens.status().code() != absl::StatusCode::kAborted ||
               std::string(outcome.tokens.status().message()).find("failovers") ==
                   std::string::npos) {
      return "request " + std::to_string(id) + " failed: " + outcome.tokens.status().ToString();
    }
  }
  std::vector<std::string> violations = c.violations();
  if (!violations.empty()) return violations[0] + " (" + what + ")";
  c.signals().SetFaults({});
  if (!c.AwaitRingsEmpty(5000)) return "a ring slot leaked (" + what + ")";
  return "";
}

TEST(PpCampaignTest, EverySeedHoldsTheContract) {
  auto server = directory::testing::StartTestDirectory(/*lease_ttl_ms=*/500);
  ASSERT_TRUE(server.ok());
  int64_t seeds = *EnvInt("CONNEX_TEST_SEEDS", 200, 1, 1'000'000);
  int64_t first = 1;
  if (GetEnv("CONNEX_TEST_SEED")) {
    first = *EnvInt("CONNEX_TEST_SEED", 1, 0, INT64_MAX);
    if (!GetEnv("CONNEX_TEST_SEEDS")) seeds = 1;  // both: SEEDS seeds from SEED
  }
  int failures = 0;
  for (int64_t seed = first; seed < first + seeds; ++seed) {
    std::string summary;
    std::string problem = RunSeed(**server, static_cast<uint64_t>(seed), &summary);
    if (!problem.empty()) {
      ++failures;
      ADD_FAILURE() << "seed " << seed << ": " << problem << " [actions: " << summary << "]"
                    << " (reproduce: CONNEX_TEST_SEED=" << seed << ")";
      if (failures >= 5) break;
    }
  }
}

}  // namespace
}  // namespace connex::pp
