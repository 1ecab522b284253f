#include "connex/pp/testing/cluster.h"

#include <algorithm>
#include <chrono>

#include "connex/base/logging.h"
#include "connex/base/wait.h"

namespace connex::pp::testing {

StageNodeOptions FastTestOptions() {
  StageNodeOptions o;
  o.step_timeout_ms = 300;
  o.probe_timeout_ms = 150;
  o.ring_slots = 8;
  o.slot_bytes = 1 << 16;
  o.route_wait_ms = 10000;
  return o;
}

Cluster::Cluster(directory::DirectoryServer& server, std::string model, uint32_t stages,
                 uint64_t seed, StageNodeOptions options, EngineFactory engines)
    : directory_(server.bind_address()),
      model_(std::move(model)),
      stages_(stages),
      options_(std::move(options)),
      engines_(std::move(engines)) {
  transport::mem::FabricOptions fabric;
  fabric.seed = seed;
  fabric.partition_timeout_ms = 100;
  fabric_ = transport::mem::Fabric::Create(fabric);
  signals_ = MemSignalNetwork::Create(seed);
}

Cluster::~Cluster() {
  for (auto& [key, m] : members_) {
    if (m.node) m.node->Stop(false);
    m.node.reset();
    m.client.reset();
  }
  signals_->Stop();
}

Cluster::Member& Cluster::Get(uint32_t stage, uint32_t replica) {
  return members_[{stage, replica}];
}

StageNode* Cluster::Start(uint32_t stage, uint32_t replica) {
  absl::StatusOr<StageNode*> started = TryStart(stage, replica);
  if (!started.ok()) {
    last_start_error_ = started.status();
    CONNEX_LOG_WARN("cluster {}: stage {} of replica {} did not start: {}", model_, stage, replica,
                    started.status().ToString());
    return nullptr;
  }
  return *started;
}

absl::StatusOr<StageNode*> Cluster::TryStart(uint32_t stage, uint32_t replica) {
  Member& m = Get(stage, replica);
  if (m.engine) graveyard_.push_back(std::move(m.engine));
  directory::DirectoryClientOptions client;
  client.directory = directory_;
  auto c = directory::DirectoryClient::Connect(client);
  if (!c.ok()) return c.status();
  m.client = *std::move(c);
  m.client->DelayEventsForTest(event_delay_ms_);
  // PD: `stage` is the group; the frontend is stage 0, both pools stage 1.
  const uint32_t pipeline_stage = pd_ ? (stage == kPdFrontendGroup ? 0 : 1) : stage;
  m.engine = engines_ ? engines_(pipeline_stage, stages_)
                      : std::make_unique<TestEngine>(pipeline_stage, stages_);
  if (m.engine == nullptr) return absl::InternalError("the engine factory made no engine");
  transport::TransportOptions t;
  t.backend = transport::Backend::kMem;
  t.local_lid = Lid{model_, stage, 0, replica};
  t.fabric = fabric_;
  t.heartbeat_ms = 20;
  t.suspect_ms = 200;
  auto transfer = transport::CreateTransferEngine(t);
  if (!transfer.ok()) return transfer.status();
  StageNodeOptions o = options_;
  o.model = model_;
  o.stage = pipeline_stage;
  o.stages = stages_;
  o.replica = replica;
  if (pd_) {
    o.pd_role = stage == kPdFrontendGroup  ? PdRole::kFrontend
                : stage == kPdPrefillGroup ? PdRole::kPrefill
                                           : PdRole::kDecode;
  }
  auto node =
      StageNode::Start(o, *m.engine, *std::move(transfer), signals_->NewEndpoint(), *m.client);
  if (!node.ok()) return node.status();
  m.node = *std::move(node);
  m.alive = true;
  return m.node.get();
}

absl::Status Cluster::StartAll(uint32_t replicas, int64_t timeout_ms) {
  const uint32_t groups = pd_ ? kPdGroups : stages_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto ms_left = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
  };
  for (uint32_t r = 0; r < replicas; ++r) {
    for (uint32_t s = 0; s < groups; ++s) {
      // A directory that did not answer in time (a loaded machine), or still holds the lease of
      // a JOIN whose reply came too late: tried again until the deadline, and counted.
      StageNode* node = nullptr;
      WaitUntil(
          [&] {
            node = Start(s, r);
            if (node != nullptr) return true;
            const absl::StatusCode code = last_start_error_.code();
            if (code != absl::StatusCode::kDeadlineExceeded &&
                code != absl::StatusCode::kUnavailable &&
                code != absl::StatusCode::kAlreadyExists) {
              return true;  // not worth another try
            }
            ++start_retries_;
            return false;
          },
          ms_left(), 100);
      if (node == nullptr) {
        return absl::InternalError("stage " + std::to_string(s) + " of replica " +
                                   std::to_string(r) +
                                   " did not start: " + last_start_error_.ToString());
      }
    }
  }
  return AwaitMembers(static_cast<size_t>(replicas) * groups, std::max<int64_t>(ms_left(), 1000));
}

absl::Status Cluster::AwaitMembers(size_t members, int64_t timeout_ms) {
  // Owners route only through stages they can see: wait as another process would.
  directory::DirectoryClientOptions client;
  client.directory = directory_;
  auto watcher = directory::DirectoryClient::Connect(client);
  if (!watcher.ok()) return watcher.status();
  absl::Status watch = (*watcher)->Watch(model_);
  if (!watch.ok()) return watch;
  if (!(*watcher)->AwaitView(
          model_, [members](const auto& v) { return v.size() == members; }, timeout_ms)) {
    return absl::InternalError("the directory did not show " + std::to_string(members) +
                               " members of " + model_);
  }
  return absl::OkStatus();
}

void Cluster::SetDirectoryEventDelay(int ms) {
  event_delay_ms_ = ms;
  for (auto& [key, m] : members_) {
    if (m.client) m.client->DelayEventsForTest(ms);
  }
}

void Cluster::Kill(uint32_t stage, uint32_t replica) {
  Member& m = Get(stage, replica);
  if (!m.alive) return;
  m.alive = false;
  fabric_->Kill(Lid{model_, stage, 0, replica});
  dead_stats_.push_back(m.node->stats());
  m.node->Stop(false);
  m.node.reset();
  m.client.reset();  // no LEAVE: the lease runs out
}

void Cluster::Leave(uint32_t stage, uint32_t replica) {
  Member& m = Get(stage, replica);
  if (!m.alive) return;
  m.alive = false;
  m.node->Stop(true, 5000);
  dead_stats_.push_back(m.node->stats());
  m.node.reset();
  m.client.reset();
}

absl::Status Cluster::Migrate(uint32_t stage, uint32_t replica) {
  Member& m = Get(stage, replica);
  if (!m.alive) return absl::FailedPreconditionError("not alive");
  return m.node->Migrate(signals_->NewEndpoint());
}

StageNode* Cluster::node(uint32_t stage, uint32_t replica) {
  return Get(stage, replica).node.get();
}
directory::DirectoryClient* Cluster::client(uint32_t stage, uint32_t replica) {
  return Get(stage, replica).client.get();
}
TestEngine* Cluster::engine(uint32_t stage, uint32_t replica) {
  return dynamic_cast<TestEngine*>(Get(stage, replica).engine.get());
}
bool Cluster::alive(uint32_t stage, uint32_t replica) const {
  auto it = members_.find({stage, replica});
  return it != members_.end() && it->second.alive;
}

absl::Status Cluster::Submit(uint32_t replica, uint64_t id, std::vector<int32_t> prompt,
                             int max_new, int64_t timeout_ms, Sampling sampling) {
  {
    connex::MutexLock lock(&mu_);
    outcomes_[id] = Outcome{};
  }
  StageNode* owner = node(0, replica);
  if (owner == nullptr) return absl::FailedPreconditionError("no live owner");
  SubmitOptions options;
  options.timeout_ms = timeout_ms;
  options.sampling = sampling;
  options.on_token = [this](uint64_t rid, int32_t token) {
    connex::MutexLock lock(&mu_);
    Outcome& o = outcomes_[rid];
    o.streamed_after_done |= o.done;
    o.streamed.push_back(token);
  };
  return owner->Submit(
      id, std::move(prompt), max_new,
      [this](uint64_t rid, absl::StatusOr<std::vector<int32_t>> r) {
        connex::MutexLock lock(&mu_);
        outcomes_[rid].done = true;
        outcomes_[rid].tokens = std::move(r);
      },
      std::move(options));
}

bool Cluster::AwaitAll(int64_t timeout_ms) {
  return WaitUntil(
      [this] {
        connex::MutexLock lock(&mu_);
        for (const auto& [id, o] : outcomes_) {
          if (!o.done) return false;
        }
        return true;
      },
      timeout_ms, 5);
}

std::map<uint64_t, Outcome> Cluster::outcomes() const {
  connex::MutexLock lock(&mu_);
  return outcomes_;
}

size_t Cluster::ForgetFinished() {
  connex::MutexLock lock(&mu_);
  size_t failed = 0;
  for (auto it = outcomes_.begin(); it != outcomes_.end();) {
    if (!it->second.done) {
      ++it;
      continue;
    }
    failed += it->second.tokens.ok() ? 0 : 1;
    it = outcomes_.erase(it);
  }
  return failed;
}

size_t Cluster::InFlight() const {
  connex::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, o] : outcomes_) n += o.done ? 0 : 1;
  return n;
}

std::vector<std::string> Cluster::violations() const {
  std::vector<std::string> out;
  for (const auto& [key, m] : members_) {
    if (auto* e = dynamic_cast<TestEngine*>(m.engine.get())) {
      for (std::string& v : e->violations()) out.push_back(std::move(v));
    }
  }
  for (const auto& dead : graveyard_) {
    if (auto* e = dynamic_cast<TestEngine*>(dead.get())) {
      for (std::string& v : e->violations()) out.push_back(std::move(v));
    }
  }
  return out;
}

bool Cluster::AwaitRingsEmpty(int64_t timeout_ms) {
  return WaitUntil(
      [this] {
        for (const auto& [key, m] : members_) {
          if (m.alive && m.node->stats().ring_in_use != 0) return false;
        }
        return true;
      },
      timeout_ms, 5);
}

bool Cluster::AwaitNoStateHeld(int64_t timeout_ms) {
  return WaitUntil([this] { return StateHeld().empty(); }, timeout_ms, 5);
}

std::string Cluster::StateHeld() const {
  std::string out;
  for (const auto& [key, m] : members_) {
    if (!m.alive || !m.engine) continue;
    size_t n = m.engine->NumHeldRequests();
    if (n > 0) {
      out += (out.empty() ? "" : ", ") + std::to_string(key.first) + "/" +
             std::to_string(key.second) + ": " + std::to_string(n) + " requests";
    }
  }
  return out;
}

size_t Cluster::MirrorsHeld() const {
  size_t n = 0;
  for (const auto& [key, m] : members_) {
    if (m.alive && m.node) n += m.node->stats().kv_mirrors_held;
  }
  return n;
}

StageNodeStats Cluster::TotalStats() const {
  StageNodeStats total;
  auto add = [&total](const StageNodeStats& s) {
    total.steps_executed += s.steps_executed;
    total.steps_replayed += s.steps_replayed;
    total.duplicates_dropped += s.duplicates_dropped;
    total.fenced += s.fenced;
    total.missing_reported += s.missing_reported;
    total.late_dropped += s.late_dropped;
    total.resends += s.resends;
    total.failovers += s.failovers;
    total.reprefills += s.reprefills;
    total.aborted += s.aborted;
    total.completed += s.completed;
    total.backpressured += s.backpressured;
    total.forged_dropped += s.forged_dropped;
    total.strangers_ignored += s.strangers_ignored;
    total.released += s.released;
    total.chunked += s.chunked;
    total.lag_recomputes += s.lag_recomputes;
    total.rewound += s.rewound;
    total.kv_standby |= s.kv_standby;
    total.kv_mirrored_bytes += s.kv_mirrored_bytes;
    total.kv_mirror_updates += s.kv_mirror_updates;
    for (size_t i = 0; i < s.kv_standby_lag.size(); ++i) {
      total.kv_standby_lag[i] += s.kv_standby_lag[i];
    }
    total.kv_standby_changes += s.kv_standby_changes;
    total.kv_mirrors_held += s.kv_mirrors_held;
    total.kv_mirror_bytes_held += s.kv_mirror_bytes_held;
    total.kv_mirrors_dropped_for_budget += s.kv_mirrors_dropped_for_budget;
    total.kv_takeovers += s.kv_takeovers;
    total.kv_takeovers_lagged += s.kv_takeovers_lagged;
    total.pd_handoffs += s.pd_handoffs;
    total.pd_retained_resumes += s.pd_retained_resumes;
    total.pd_handoff_updates += s.pd_handoff_updates;
    total.pd_handoff_bytes += s.pd_handoff_bytes;
    total.pd_retained += s.pd_retained;
    total.pd_retained_bytes += s.pd_retained_bytes;
    total.pd_retention_expired += s.pd_retention_expired;
    total.pd_results_held += s.pd_results_held;
    total.pd_handoff_waits_expired += s.pd_handoff_waits_expired;
  };
  for (const auto& [key, m] : members_) {
    if (m.node) add(m.node->stats());
  }
  for (const StageNodeStats& s : dead_stats_) add(s);
  return total;
}

}  // namespace connex::pp::testing
