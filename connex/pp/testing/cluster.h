// Cluster: replica chains of StageNodes over the mem transport and the mem signal network, with a
// real in-process directory, for the step protocol's tests. Each node has its own directory
// client, as its own process would. Thread-compatible (driven by one test thread).
#ifndef CONNEX_PP_TESTING_CLUSTER_H_
#define CONNEX_PP_TESTING_CLUSTER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "connex/pp/mem_signal.h"
#include "connex/pp/node.h"
#include "connex/pp/testing/test_engine.h"
#include "connex/transport/mem/mem_engine.h"

namespace connex::pp::testing {

// What one request ended with.
struct Outcome {
  bool done = false;
  absl::StatusOr<std::vector<int32_t>> tokens = absl::UnknownError("not finished");
  std::vector<int32_t> streamed;  // from the token callback, in arrival order
  bool streamed_after_done = false;
};

// Timeouts short enough for tests (a 300 ms step timeout, a 150 ms probe), 8 slots of 64 KiB.
StageNodeOptions FastTestOptions();

class Cluster {
 public:
  // Makes the engine of a stage (each start of a node gets a fresh one, as a new process would).
  using EngineFactory = std::function<std::unique_ptr<Engine>(uint32_t stage, uint32_t stages)>;
  // `server` is shared (one directory serves many clusters, each with its own model name). Only
  // its address is kept: a server restarted at the same ports serves the cluster on.
  // Without `engines`, every stage runs a TestEngine.
  Cluster(directory::DirectoryServer& server, std::string model, uint32_t stages, uint64_t seed,
          StageNodeOptions options, EngineFactory engines = nullptr);
  ~Cluster();

  // Prefill-decode (pd.h; the cluster's stages must be 2): from now on every method's `stage` is
  // a PD group — 0 a frontend (stage 0), 1 a prefill instance, 2 a decode instance (stage 1) —
  // and StartAll starts every group.
  void SetPd(bool on) { pd_ = on; }
  // nullptr when it did not start; last_start_error() says why (also logged).
  StageNode* Start(uint32_t stage, uint32_t replica);
  const absl::Status& last_start_error() const { return last_start_error_; }
  // Starts every stage of replicas 0..replicas-1 and waits until the directory shows `members`
  // records of the model (default: all of them), within `timeout_ms` in all. A start that the
  // directory did not answer in time (or refused for a lease its late reply left) is tried again
  // until then, and counted (start_retries). Internal names what did not come up.
  absl::Status StartAll(uint32_t replicas, int64_t timeout_ms = 5000);
  int64_t start_retries() const { return start_retries_; }
  // Waits until the directory shows exactly `members` records of the model.
  absl::Status AwaitMembers(size_t members, int64_t timeout_ms = 5000);
  // As SIGKILL would: transport and signals die, no LEAVE.
  void Kill(uint32_t stage, uint32_t replica);
  // Graceful: LEFT, drain, stop.
  void Leave(uint32_t stage, uint32_t replica);
  absl::Status Migrate(uint32_t stage, uint32_t replica);
  StageNode* node(uint32_t stage, uint32_t replica);
  // The directory client of a stage's current process (nullptr if it never started).
  directory::DirectoryClient* client(uint32_t stage, uint32_t replica);
  // The stage's TestEngine (nullptr when the cluster runs other engines).
  TestEngine* engine(uint32_t stage, uint32_t replica);
  bool alive(uint32_t stage, uint32_t replica) const;

  // Submits a request to the stage-0 node of `replica`.
  absl::Status Submit(uint32_t replica, uint64_t id, std::vector<int32_t> prompt, int max_new,
                      int64_t timeout_ms = 0, Sampling sampling = {});
  // Waits until every submitted request finished; false after `timeout_ms`.
  bool AwaitAll(int64_t timeout_ms);
  std::map<uint64_t, Outcome> outcomes() const;
  // Drops the outcomes of finished requests (long runs); returns how many of them failed.
  size_t ForgetFinished();
  // Requests submitted and not finished.
  size_t InFlight() const;
  // Every double execution any engine (live or killed) saw.
  std::vector<std::string> violations() const;
  // Waits until no live node has a ring slot in use; false after `timeout_ms`.
  bool AwaitRingsEmpty(int64_t timeout_ms);
  StageNodeStats TotalStats() const;
  // Waits until no live engine holds any request's state; false after `timeout_ms`.
  bool AwaitNoStateHeld(int64_t timeout_ms);
  // "stage/replica: n requests" for every live engine that holds state ("" when none does).
  std::string StateHeld() const;
  // KV standby mirrors the live nodes hold now (TotalStats adds what killed nodes held when they
  // died).
  size_t MirrorsHeld() const;

  // Every node's directory client (now and later) sees events `ms` late.
  void SetDirectoryEventDelay(int ms);

  MemSignalNetwork& signals() { return *signals_; }
  transport::mem::Fabric& fabric() { return *fabric_; }
  const std::string& model() const { return model_; }
  uint32_t stages() const { return stages_; }
  bool pd() const { return pd_; }

 private:
  struct Member {
    std::unique_ptr<directory::DirectoryClient> client;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<StageNode> node;
    bool alive = false;
  };
  Member& Get(uint32_t stage, uint32_t replica);
  absl::StatusOr<StageNode*> TryStart(uint32_t stage, uint32_t replica);

  const std::string directory_;  // the server's request address (the same after its restarts)
  const std::string model_;
  const uint32_t stages_;
  const StageNodeOptions options_;
  std::shared_ptr<transport::mem::Fabric> fabric_;
  std::shared_ptr<MemSignalNetwork> signals_;
  std::map<std::pair<uint32_t, uint32_t>, Member> members_;
  const EngineFactory engines_;
  std::vector<std::unique_ptr<Engine>> graveyard_;  // engines of killed nodes
  std::vector<StageNodeStats> dead_stats_;
  int event_delay_ms_ = 0;
  absl::Status last_start_error_;
  int64_t start_retries_ = 0;
  mutable connex::Mutex mu_;
  std::map<uint64_t, Outcome> outcomes_ ABSL_GUARDED_BY(mu_);
  bool pd_ = false;
};

}  // namespace connex::pp::testing

#endif  // CONNEX_PP_TESTING_CLUSTER_H_
