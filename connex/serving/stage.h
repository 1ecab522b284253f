// StageProcess: one pipeline stage of a served model, as connex-stage runs it — it loads only its
// layer slice of the checkpoint (engine::StageEngine), connects to the directory, opens the data
// plane and the signal socket, and serves steps through the step protocol (pp::StageNode) under
// LID (model, stage, 0, replica). Stage 0 is the owner of the requests submitted to it (node()
// Submit / Cancel); the HTTP API sits on top of that. Thread-safe after Start (StageNode is).
#ifndef CONNEX_SERVING_STAGE_H_
#define CONNEX_SERVING_STAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/directory/client.h"
#include "connex/engine/model_config.h"
#include "connex/engine/stage_engine.h"
#include "connex/pp/node.h"
#include "connex/serving/model_name.h"  // ServedModelName: the default of model_name

namespace connex::serving {

struct StageProcessOptions {
  std::string directory = "tcp://127.0.0.1:7000";  // CONNEX_DIRECTORY
  std::string model_path;  // CONNEX_MODEL: a .safetensors file or a directory with one
  // The served model's name: the LIDs' model, what /v1/models lists and clients send.
  // CONNEX_MODEL_NAME; empty: the checkpoint's name (ServedModelName).
  std::string model_name;
  uint32_t stage = 0;            // CONNEX_STAGE
  uint32_t stages = 1;           // CONNEX_STAGES
  uint32_t replica = 0;          // CONNEX_REPLICA
  std::string backend = "auto";  // CONNEX_PP_BACKEND: auto, tcp, shm, ucx (mem is for tests)
  std::string signal_host = "127.0.0.1";  // CONNEX_SIGNAL_HOST: where the signal socket binds
  int threads = 0;  // CONNEX_ENGINE_THREADS; 0: what EngineThreadsFromEnv says
  // --kv-standby on|off: overrides CONNEX_PP_KV_STANDBY when set (pp::StageNodeOptions).
  std::optional<bool> kv_standby;
  // --pd-role (CONNEX_PD_ROLE): this process's role in a prefill-decode deployment (pp/pd.h;
  // --stages 2: a frontend is stage 0, a prefill or decode instance stage 1). A frontend runs
  // the embedding alone, an instance every layer and the head. kNone: a pipeline stage.
  pp::PdRole pd_role = pp::PdRole::kNone;

  // Stage, stages and names checked together; InvalidArgument names what is wrong.
  absl::Status Validate() const;
};

class StageProcess {
 public:
  // Loads the slice, connects, joins and serves. Every error is returned at once, named, and
  // leaves nothing running. `node_defaults` carries the step protocol's settings (then
  // overridden by the CONNEX_PP_* variables).
  static absl::StatusOr<std::unique_ptr<StageProcess>> Start(
      StageProcessOptions options, pp::StageNodeOptions node_defaults = {});
  ~StageProcess();  // Stop(/*leave=*/false)

  StageProcess(const StageProcess&) = delete;
  StageProcess& operator=(const StageProcess&) = delete;

  pp::StageNode& node() { return *node_; }
  directory::DirectoryClient& directory() { return *directory_; }
  const engine::ModelConfig& config() const { return engine_->config(); }
  const Lid& lid() const { return node_->lid(); }
  const std::string& model_name() const { return options_.model_name; }
  // The checkpoint as given (--model): its directory holds the tokenizer files.
  const std::string& model_path() const { return options_.model_path; }
  uint32_t stages() const { return options_.stages; }
  // Stages the model's layers are split over: a prefill-decode deployment's instances each run
  // every layer (1); else stages().
  uint32_t layer_stages() const {
    return options_.pd_role == pp::PdRole::kNone ? options_.stages : 1;
  }
  // Whether every stage of this replica's pipeline has a live replica in the directory now and,
  // on stage 0, its requests progress (no step came back for kStalledUnhealthyMs while some were
  // in flight: unhealthy, whatever the directory shows), with what is wrong when not.
  absl::Status ChainReady() const;

  // Graceful (leave): LEFT, in-flight steps finish, then stop; otherwise as a crash would.
  void Stop(bool leave, int64_t drain_timeout_ms = 10000);

 private:
  StageProcess() = default;
  StageProcessOptions options_;
  std::unique_ptr<directory::DirectoryClient> directory_;
  std::unique_ptr<engine::StageEngine> engine_;
  std::unique_ptr<pp::StageNode> node_;
  // ChainReady: a stage 0 with requests in flight and no step back for longer is unhealthy:
  // 3 step timeouts, at least 15 s (a long prefill is not a stall).
  int64_t stall_unhealthy_ms_ = 15'000;
};

}  // namespace connex::serving

#endif  // CONNEX_SERVING_STAGE_H_
