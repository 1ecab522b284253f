// The randomized fault campaign of the step protocol: for every seed, two replica chains of a
// three-stage pipeline generate while stages are killed, restarted, drained, migrated and added,
// reads fail or slow down, signals are dropped, delayed and duplicated, and directory events
// arrive late; owners are killed and restarted under their LID and submit the same request ids
// again; the directory is killed and restarted, with or without its state; a share of seeds sends
// prompts larger than a ring slot. For every seed: every planned action runs; no step runs twice on
// any stage; every request finishes with exactly the tokens of an undisturbed run, or is aborted
// after the re-prefill limit; no ring slot leaks; no request outlives a bound; no engine holds any
// request's state at the end. CONNEX_TEST_SEEDS sets the number of seeds (default 200),
// CONNEX_TEST_SEED runs one seed, CONNEX_TEST_SEED_JOBS how many seeds run at once (default 4).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "connex/base/config.h"
#include "connex/base/wait.h"
#include "connex/directory/testing/reserved_ports.h"
#include "connex/directory/testing/state_dir.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/engine/generator.h"
#include "connex/engine/random_model.h"
#include "connex/engine/stage_engine.h"
#include "connex/engine/thread_pool.h"
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
  Sampling sampling;  // greedy, or (on the Llama seeds) sampled
};

std::vector<int32_t> RandomPrompt(std::mt19937_64& rng) {
  std::vector<int32_t> p(1 + rng() % 12);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 200);
  return p;
}

// An eighth of the seeds runs the reference Llama engine (a small random model, 3 layers over the 3
// stages): its KV caches, chunked prefill and recompute, against an undisturbed in-process run.
class LlamaModel {
 public:
  static const LlamaModel& Get() {
    static const LlamaModel model;  // written once per test process, removed at its exit
    return model;
  }
  ~LlamaModel() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  const std::string& path() const { return path_; }
  // `pd`: a prefill-decode deployment's engines (a frontend runs the embedding alone, an
  // instance every layer).
  Cluster::EngineFactory Factory(bool pd = false) const {
    return [path = path_, pd](uint32_t stage, uint32_t stages) -> std::unique_ptr<Engine> {
      engine::StageOptions so;
      so.stage = static_cast<int>(stage);
      so.stages = static_cast<int>(stages);
      if (pd) so.layers = stage == 0 ? engine::LayerRange{0, 0} : engine::LayerRange{0, 3};
      so.pool = std::make_shared<engine::ThreadPool>(1);
      auto e = engine::StageEngine::Load(path, so);
      if (!e.ok()) return nullptr;
      return *std::move(e);
    };
  }
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new,
                                 const Sampling& sampling) const {
    auto pipeline = engine::Pipeline::Load(path_, kStages, std::make_shared<engine::ThreadPool>(1));
    if (!pipeline.ok()) return {};
    engine::GenerateOptions g;
    g.max_tokens = max_new;
    g.stop_at_eos = false;
    if (!sampling.argmax()) g.sampling = {sampling};
    auto out = engine::Generate(**pipeline, {prompt}, g);
    return out.ok() ? (*out)[0].tokens : std::vector<int32_t>{};
  }

 private:
  LlamaModel() {
    dir_ =
        (std::filesystem::temp_directory_path() / ("connex-campaign-" + std::to_string(::getpid())))
            .string();
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/model.safetensors";
    engine::ModelConfig c;
    c.hidden_size = 64;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.intermediate_size = 128;
    absl::Status w = engine::WriteRandomModel(path_, c, 7, DType::kF32);
    if (!w.ok()) path_.clear();
  }
  std::string dir_;
  std::string path_;
};

// A worker's directory: one server for every seed the worker runs, with a state dir as in
// production, at reserved ports (directory/testing/reserved_ports.h: no other test nor outgoing
// connection takes them while it is down). A seed restarts it as kill -9 and a restart would: with
// its state (the restart is invisible to holders and watchers) or without (a fresh machine: every
// endpoint registers again under a new epoch, every watcher sees the old ones fail).
class CampaignDirectory {
 public:
  explicit CampaignDirectory(int worker) {
    // In memory where there is one (directory/testing/state_dir.h): the campaign checks the
    // protocol, not the disk; on a busy disk the directories' state writes took up to 1.5 s here
    // and stalled all four at once past a JOIN's 3 s.
    state_dir_ = directory::testing::TestStateDir(
        "connex-campaign-directory-" + std::to_string(::getpid()) + "-" + std::to_string(worker));
    std::filesystem::remove_all(state_dir_);
    options_.lease_ttl_ms = 500;
    options_.heartbeat_ms = 100;
    options_.tick_ms = 50;
    options_.admin_token = directory::testing::kTestAdminToken;
    options_.state_dir = state_dir_;
  }
  ~CampaignDirectory() {
    server_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(state_dir_, ignored);
  }

  absl::Status Start() {
    absl::Status last = absl::UnavailableError("no port tried");
    for (int attempt = 0; attempt < 50; ++attempt) {
      ports_ = directory::testing::ReservedPorts::Take(2);
      if (!ports_) return absl::UnavailableError("no two ports to reserve");
      options_.bind = "tcp://127.0.0.1:" + std::to_string(ports_->first());
      options_.pub = "tcp://127.0.0.1:" + std::to_string(ports_->first() + 1);
      auto server = directory::DirectoryServer::Start(options_);
      if (server.ok()) {
        server_ = *std::move(server);
        return absl::OkStatus();
      }
      last = server.status();
    }
    return last;
  }

  // Stops the server (no goodbye to anyone), waits `down_ms`, starts it again at the same ports,
  // with or without what it had saved.
  absl::Status Restart(bool keep_state, int down_ms) {
    NoteStateWrites();
    server_.reset();
    if (!keep_state) std::filesystem::remove_all(state_dir_);
    std::this_thread::sleep_for(std::chrono::milliseconds(down_ms));  // the outage itself
    absl::Status last;
    // The ports were ours a moment ago; a bind can still race the old sockets' close.
    if (WaitUntil(
            [&] {
              auto server = directory::DirectoryServer::Start(options_);
              if (server.ok()) server_ = *std::move(server);
              last = server.status();
              return server_ != nullptr;
            },
            5000)) {
      return absl::OkStatus();
    }
    return last;
  }

  directory::DirectoryServer& server() { return *server_; }
  // The longest one write of its state dir took, over every start of the server (ms).
  int64_t longest_state_write_ms() {
    NoteStateWrites();
    return longest_state_write_ms_;
  }

 private:
  void NoteStateWrites() {
    if (server_ != nullptr) {
      longest_state_write_ms_ =
          std::max(longest_state_write_ms_, server_->longest_state_write_ms());
    }
  }

  int64_t longest_state_write_ms_ = 0;
  std::optional<directory::testing::ReservedPorts> ports_;  // options_'s, while held
  std::string state_dir_;
  directory::DirectoryServerOptions options_;
  std::unique_ptr<directory::DirectoryServer> server_;
};

// Tokens streamed so far over every request: the campaign's measure of progress.
size_t Streamed(const Cluster& c) {
  size_t n = 0;
  for (const auto& [id, o] : c.outcomes()) n += o.streamed.size();
  return n;
}

bool AllDone(const Cluster& c) {
  for (const auto& [id, o] : c.outcomes()) {
    if (!o.done) return false;
  }
  return true;
}

// Starts (stage, replica), possibly again after it was killed, as a supervisor (systemd)
// restarts a process that exited: for up to 20 s, while the cause is one that passes — the dead
// process's lease still holds the LID (Join waits one lease TTL, and on a loaded machine the
// directory's expiry comes later still: seed 962 of a loaded run), or the directory is slow to
// answer (its state-dir writes wait on a disk the builds beside it keep busy: seed 412). Any
// other error fails at once.
bool StartAsASupervisorWould(Cluster& c, uint32_t stage, uint32_t replica) {
  return WaitUntil(
             [&] {
               if (c.Start(stage, replica) != nullptr) return true;
               absl::StatusCode code = c.last_start_error().code();
               return code != absl::StatusCode::kAlreadyExists &&
                      code != absl::StatusCode::kUnavailable &&
                      code != absl::StatusCode::kDeadlineExceeded;
             },
             20000) &&
         c.alive(stage, replica);
}

// Runs one seed; returns a description of what went wrong, or "" when all held.
std::string RunSeed(CampaignDirectory& directory, uint64_t seed, std::string* summary,
                    std::map<std::string, int>* tally) {
  std::mt19937_64 rng(seed * 7919 + 1);
  StageNodeOptions o;
  o.step_timeout_ms = 120 + static_cast<int64_t>(rng() % 100);
  o.probe_timeout_ms = 80;
  o.inflight = 1 + static_cast<int>(rng() % 4);
  o.max_batch = 1 + static_cast<int>(rng() % 6);
  o.ring_slots = 2 + static_cast<int>(rng() % 8);
  // A share of seeds runs with small slots and a long prompt: steps near and over a slot.
  const bool small_slots = rng() % 4 == 0;
  o.slot_bytes = small_slots ? 4096 : 1 << 16;
  o.reprefill_max = 8;
  o.route_wait_ms = 20000;
  o.request_timeout_ms = kRequestBoundMs;
  // Half the seeds (all with CONNEX_TEST_KV_STANDBY=all) keep a KV standby of every later
  // stage: kills and leaves are taken over from mirrors, the rest holds as without.
  const std::string kv_mode = EnvString("CONNEX_TEST_KV_STANDBY", "half");
  o.kv_standby = kv_mode == "all" || (kv_mode == "half" && (seed * 0x9E3779B97F4A7C15ull) >> 63);
  o.kv_standby_grace_ms = 1000;
  const bool llama = seed % 8 == 0;
  if (llama && LlamaModel::Get().path().empty())
    return "the campaign's Llama model was not written";
  // A quarter of the seeds (all with CONNEX_TEST_PD=all, none with none) is a prefill-decode
  // deployment (pd.h): two frontends, prefill instances in group 1 and decode instances in group
  // 2 in the place of stages 1 and 2, faulted alike.
  const std::string pd_mode = EnvString("CONNEX_TEST_PD", "quarter");
  const bool pd = pd_mode == "all" || (pd_mode == "quarter" && seed % 4 == 3);
  const uint32_t stages = pd ? 2 : kStages;
  Cluster c(directory.server(), "c" + std::to_string(seed), stages, seed, o,
            llama ? LlamaModel::Get().Factory(pd) : nullptr);
  c.SetPd(pd);
  // A loaded machine (CI runs the sanitizer builds beside other tests) may take a while.
  // StartAll tries a start again when the directory did not answer in time; how often is
  // counted (start-retries in the summary). Seen in loaded `make test` runs while the process
  // was scheduled on time: a slow reader of stderr stops every thread that logs, the
  // directories' too (docs/development.md).
  absl::Status up = c.StartAll(2, 20000);
  if (c.start_retries() > 0) (*tally)["start-retries"] += static_cast<int>(c.start_retries());
  if (!up.ok()) return "the cluster did not start: " + up.ToString();

  SignalFaults faults;
  faults.drop = (rng() % 3 == 0) ? 0.02 * static_cast<double>(rng() % 3) : 0;
  faults.duplicate = (rng() % 2 == 0) ? 0.05 * static_cast<double>(rng() % 3) : 0;
  faults.delay = (rng() % 2 == 0) ? 0.1 * static_cast<double>(rng() % 3) : 0;
  faults.max_delay_ms = 1 + static_cast<int>(rng() % 30);
  c.signals().SetFaults(faults);
  if (rng() % 3 == 0) c.SetDirectoryEventDelay(1 + static_cast<int>(rng() % 40));

  std::map<uint64_t, Plan> plans;
  std::map<uint64_t, uint32_t> owner_of;
  uint64_t next_id = 1;  // small ids: a restarted owner reuses them
  auto submit_wave = [&](int requests, bool long_first) -> size_t {
    size_t tokens = 0;
    for (int i = 0; i < requests; ++i) {
      uint64_t id = next_id++;
      Plan p{RandomPrompt(rng), 10 + static_cast<int>(rng() % 50), {}};
      if (llama && rng() % 2 == 0) {
        // Sampled: the handover must keep the draws too (keyed by seed and position).
        p.sampling.temperature = 0.6f + 0.1f * static_cast<float>(rng() % 8);
        p.sampling.top_p = rng() % 2 ? 1.0f : 0.9f;
        p.sampling.top_k = rng() % 2 ? 0 : 40;
        p.sampling.seed = rng();
      }
      if (llama) {
        // vLLM's repetition penalty (greedy or sampled) and min_p on some, chosen without another
        // draw so that a seed's plan stays what it was: the penalty's tokens, which the last
        // stage keeps beside its KV cache, must survive kills, migrations and re-prefills too.
        const uint64_t bits = p.sampling.seed ^ static_cast<uint64_t>(p.prompt.size());
        if (bits % 3 == 0) p.sampling.repetition_penalty = 1.3f;
        if (!p.sampling.greedy() && bits % 4 < 2) p.sampling.min_p = 0.05f;
      }
      if (long_first && i == 0) {
        p.prompt.resize(500 + rng() % 1000);
        for (int32_t& t : p.prompt) t = static_cast<int32_t>(rng() % 200);
      }
      plans[id] = p;
      owner_of[id] = static_cast<uint32_t>(id % 2);
      if (!c.alive(0, owner_of[id])) owner_of[id] ^= 1;
      tokens += static_cast<size_t>(p.max_new);
      if (!c.Submit(owner_of[id], id, p.prompt, p.max_new, 0, p.sampling).ok()) return 0;
    }
    return tokens;
  };
  size_t total_tokens = submit_wave(4 + static_cast<int>(rng() % 5), small_slots);
  if (total_tokens == 0) return "submit failed";

  // Faults at points of progress (streamed tokens, not time), so that a seed does the same
  // things each run. Every planned action runs, with requests in flight (when the traffic
  // ran out first, a new wave arrives, as in a serving deployment), and picks among the faults
  // that apply at that moment.
  const int actions = 2 + static_cast<int>(rng() % 4);
  std::vector<size_t> marks;
  for (int a = 0; a < actions; ++a) marks.push_back(total_tokens * (5 + rng() % 60) / 100);
  std::sort(marks.begin(), marks.end());
  std::vector<std::string> did;
  for (int a = 0; a < actions; ++a) {
    size_t target = marks[a];
    if (!WaitUntil([&] { return Streamed(c) >= target || AllDone(c); }, kRequestBoundMs)) {
      return "progress stalled before action " + std::to_string(a + 1);
    }
    if (AllDone(c)) {
      size_t before = Streamed(c);
      if (submit_wave(2 + static_cast<int>(rng() % 3), false) == 0) return "submit failed";
      if (!WaitUntil([&] { return Streamed(c) > before || AllDone(c); }, kRequestBoundMs)) {
        return "a new wave made no progress before action " + std::to_string(a + 1);
      }
    }
    uint32_t stage = 1 + static_cast<uint32_t>(rng() % (kStages - 1));
    uint32_t replica = static_cast<uint32_t>(rng() % 3);
    uint32_t other = replica == 0 ? 1 : 0;
    // Keep one live replica per stage: without one, requests could only wait.
    bool other_alive = c.alive(stage, other) || (replica != 2 && c.alive(stage, 2));
    std::string tag = std::to_string(stage) + "/" + std::to_string(replica);
    std::vector<std::function<std::string()>> options;
    if (c.alive(stage, replica) && other_alive) {
      options.push_back([&] {
        c.Kill(stage, replica);
        return "kill " + tag;
      });
      options.push_back([&] {
        c.Leave(stage, replica);
        return "leave " + tag;
      });
    }
    if (!c.alive(stage, replica)) {
      options.push_back([&] {
        if (!StartAsASupervisorWould(c, stage, replica))
          return "!restart " + tag + " failed: " + c.last_start_error().ToString();
        return "restart " + tag;
      });
    }
    if (c.alive(stage, replica)) {
      options.push_back([&] {
        absl::Status m = c.Migrate(stage, replica);
        return m.ok() ? "migrate " + tag : "!migrate " + tag + " failed: " + m.ToString();
      });
    }
    if (!c.alive(stage, 2)) {
      options.push_back([&] {
        if (!StartAsASupervisorWould(c, stage, 2))
          return "!join " + std::to_string(stage) + "/2 failed: " + c.last_start_error().ToString();
        return "join " + std::to_string(stage) + "/2";
      });
    }
    Lid lid{c.model(), stage, 0, replica};
    options.push_back([&, lid] {
      c.fabric().FailNextReads(lid, 1 + static_cast<int>(rng() % 3));
      return "fail-reads " + tag;
    });
    options.push_back([&, lid] {
      c.fabric().SetReadDelay(lid, 1 + static_cast<int>(rng() % 5));
      return "slow-reads " + tag;
    });
    // An owner killed and restarted under its LID; its requests are submitted again with the
    // same ids (a restarted process counts from 1 again).
    uint32_t owner = static_cast<uint32_t>(rng() % 2);
    options.push_back([&, owner] {
      c.Kill(0, owner);
      if (!StartAsASupervisorWould(c, 0, owner))
        return "!restart-owner 0/" + std::to_string(owner) +
               " failed: " + c.last_start_error().ToString();
      for (auto& [id, r] : owner_of) {
        if (r != owner || c.outcomes()[id].tokens.ok()) continue;
        if (!c.Submit(owner, id, plans[id].prompt, plans[id].max_new, 0, plans[id].sampling).ok()) {
          return "!resubmit " + std::to_string(id) + " failed";
        }
      }
      return "restart-owner 0/" + std::to_string(owner);
    });
    // The directory killed and restarted while requests are in flight; the data plane does
    // not need it, so generation goes on while it is down.
    options.push_back([&] {
      const bool keep_state = rng() % 3 != 0;
      const int down_ms = static_cast<int>(rng() % 400);
      absl::Status restarted = directory.Restart(keep_state, down_ms);
      if (!restarted.ok()) return "!restart-directory failed: " + restarted.ToString();
      return std::string(keep_state ? "restart-directory" : "restart-directory (state lost)") +
             " after " + std::to_string(down_ms) + " ms";
    });
    did.push_back(options[rng() % options.size()]());
    ++(*tally)[did.back().substr(0, did.back().find(' '))];
    // An action that could not be carried out fails the seed: it did not run.
    if (did.back().rfind('!', 0) == 0) return did.back().substr(1);
  }
  std::string what;
  for (const std::string& d : did) what += d + ", ";
  *summary = what;

  if (!c.AwaitAll(kRequestBoundMs + 5000))
    return "a request did not finish within the bound (" + what + ")";
  for (const auto& [id, outcome] : c.outcomes()) {
    if (outcome.tokens.ok()) {
      std::vector<int32_t> want =
          llama
              ? LlamaModel::Get().Reference(plans[id].prompt, plans[id].max_new, plans[id].sampling)
              : ReferenceTokens(stages, plans[id].prompt, plans[id].max_new);
      if (*outcome.tokens != want) {
        size_t at = 0;
        while (at < want.size() && at < outcome.tokens->size() && want[at] == (*outcome.tokens)[at])
          ++at;
        return "request " + std::to_string(id) + " (prompt of " +
               std::to_string(plans[id].prompt.size()) + " tokens) diverged at token " +
               std::to_string(at) + " of " + std::to_string(want.size()) + " (" + what + ")";
      }
      if (outcome.streamed != want || outcome.streamed_after_done)
        return "request " + std::to_string(id) + " streamed other tokens than it returned (" +
               what + ")";
    } else if (outcome.tokens.status().code() != absl::StatusCode::kAborted ||
               std::string(outcome.tokens.status().message()).find("failovers") ==
                   std::string::npos) {
      return "request " + std::to_string(id) + " failed: " + outcome.tokens.status().ToString() +
             " (" + what + ")";
    }
  }
  std::vector<std::string> violations = c.violations();
  if (!violations.empty()) return violations[0] + " (" + what + ")";
  c.signals().SetFaults({});
  if (!c.AwaitRingsEmpty(5000)) return "a ring slot leaked (" + what + ")";
  if (!c.AwaitNoStateHeld(10000)) return "state left behind: " + c.StateHeld() + " (" + what + ")";
  if (pd) {
    const StageNodeStats total = c.TotalStats();
    (*tally)["pd-seeds"] += 1;
    (*tally)["pd-handoffs"] += static_cast<int>(total.pd_handoffs);
    (*tally)["pd-retained-resumes"] += static_cast<int>(total.pd_retained_resumes);
    // (A retained copy is engine state: AwaitNoStateHeld above found none left.)
  }
  if (o.kv_standby) {
    const StageNodeStats total = c.TotalStats();
    (*tally)["kv-seeds"] += 1;
    (*tally)["kv-takeovers"] += static_cast<int>(total.kv_takeovers);
    (*tally)["kv-lag-recomputes"] += static_cast<int>(total.lag_recomputes);
    (*tally)["kv-reprefills"] += static_cast<int>(total.reprefills);
    if (!WaitUntil([&] { return c.MirrorsHeld() == 0; }, 10000)) {
      return std::to_string(c.MirrorsHeld()) + " KV mirrors left behind (" + what + ")";
    }
  }
  return "";
}

// The seeds run on CONNEX_TEST_SEED_JOBS workers at once, each with its own directory (which its
// seeds restart): a seed mostly waits (leases, outages, step timeouts; one seed at a time kept
// 15 % of a core busy), so four at once take about a quarter of the time and load the machine the
// way the campaign's bounds already allow for. Failures are reported in seed order.
TEST(PpCampaignTest, EverySeedHoldsTheContract) {
  int64_t seeds = *EnvInt("CONNEX_TEST_SEEDS", 200, 1, 1'000'000);
  int64_t first = 1;
  if (GetEnv("CONNEX_TEST_SEED")) {
    first = *EnvInt("CONNEX_TEST_SEED", 1, 0, INT64_MAX);
    if (!GetEnv("CONNEX_TEST_SEEDS")) seeds = 1;  // both: SEEDS seeds from SEED
  }
  const int jobs =
      static_cast<int>(std::min<int64_t>(*EnvInt("CONNEX_TEST_SEED_JOBS", 4, 1, 64), seeds));
  struct Outcome {
    bool ran = false;
    std::string problem;
    std::string summary;
  };
  std::vector<Outcome> outcomes(static_cast<size_t>(seeds));
  std::vector<std::map<std::string, int>> tallies(static_cast<size_t>(jobs));  // actions, by kind
  std::atomic<int64_t> next{0};
  std::atomic<int> failures{0};
  std::vector<std::string> start_errors(static_cast<size_t>(jobs));
  // The directories answer nobody while they write their state: a slow disk stalls them all.
  std::vector<int64_t> longest_write_ms(static_cast<size_t>(jobs), 0);
  // How late a thread that only sleeps 50 ms at a time wakes, at worst: a loaded machine's
  // stalls, as this process saw them (printed with the summary, to tell them from the code's).
  std::atomic<bool> done{false};
  int64_t longest_late_ms = 0;
  std::thread watchdog([&] {
    auto expected = std::chrono::steady_clock::now();
    while (!done.load()) {
      expected += std::chrono::milliseconds(50);
      std::this_thread::sleep_until(expected);
      const auto now = std::chrono::steady_clock::now();
      longest_late_ms = std::max<int64_t>(
          longest_late_ms,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - expected).count());
      expected = now;
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < jobs; ++w) {
    workers.emplace_back([&, w] {
      CampaignDirectory directory(w);
      if (absl::Status up = directory.Start(); !up.ok()) {
        start_errors[static_cast<size_t>(w)] = up.ToString();
        return;
      }
      // After five failed seeds no new seed starts (those running finish).
      for (int64_t i = next++; i < seeds && failures.load() < 5; i = next++) {
        Outcome& o = outcomes[static_cast<size_t>(i)];
        o.problem = RunSeed(directory, static_cast<uint64_t>(first + i), &o.summary,
                            &tallies[static_cast<size_t>(w)]);
        o.ran = true;
        if (!o.problem.empty()) ++failures;
      }
      longest_write_ms[static_cast<size_t>(w)] = directory.longest_state_write_ms();
    });
  }
  for (std::thread& t : workers) t.join();
  done = true;
  watchdog.join();
  for (int w = 0; w < jobs; ++w) {
    EXPECT_EQ(start_errors[static_cast<size_t>(w)], "") << "worker " << w << "'s directory";
  }
  int64_t ran = 0;
  for (int64_t i = 0; i < seeds; ++i) {
    const Outcome& o = outcomes[static_cast<size_t>(i)];
    ran += o.ran ? 1 : 0;
    if (!o.problem.empty()) {
      ADD_FAILURE() << "seed " << first + i << ": " << o.problem << " [actions: " << o.summary
                    << "]"
                    << " (reproduce: CONNEX_TEST_SEED=" << first + i << ")";
    }
  }
  std::map<std::string, int> tally;
  for (const auto& t : tallies) {
    for (const auto& [kind, n] : t) tally[kind] += n;
  }
  std::string actions;
  for (const auto& [kind, n] : tally) actions += " " + kind + " " + std::to_string(n);
  std::printf(
      "campaign: %lld of %lld seeds run, %d at once; actions run:%s; the longest a sleeping "
      "thread woke late: %lld ms; the longest write of a directory's state: %lld ms\n",
      static_cast<long long>(ran), static_cast<long long>(seeds), jobs, actions.c_str(),
      static_cast<long long>(longest_late_ms),
      static_cast<long long>(*std::max_element(longest_write_ms.begin(), longest_write_ms.end())));
}

}  // namespace
}  // namespace connex::pp
