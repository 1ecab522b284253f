// Pipeline: the stages of one model run in one process, a step passing from stage to stage as a
// TensorDict packed and unpacked as the step protocol does — what a chain of stage processes
// does over the network, without it.
// Thread-compatible (one caller at a time).
#ifndef CONNEX_ENGINE_PIPELINE_H_
#define CONNEX_ENGINE_PIPELINE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/engine/stage_engine.h"

namespace connex::engine {

class Pipeline {
 public:
  // Loads `stages` stages of the model at `path`, sharing `pool` (nullptr: one pool of
  // EngineThreadsFromEnv() threads), with their streamed weights where `weights` says (nullopt:
  // WeightMemoryFromEnv(), StageOptions::weights).
  static absl::StatusOr<std::unique_ptr<Pipeline>> Load(
      const std::string& path, int stages, std::shared_ptr<ThreadPool> pool = nullptr,
      std::optional<WeightMemory> weights = std::nullopt);

  // Runs `in` (a stage-0 step) through every stage; the result is the last stage's output.
  // Between stages the dict goes through pp::Pack / pp::Unpack (a send-ring slot's format).
  absl::StatusOr<TensorDict> Step(const TensorDict& in);

  // Drops request `id` on every stage.
  void Release(uint64_t id);

  const ModelConfig& config() const { return stages_.front()->config(); }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  StageEngine& stage(int i) { return *stages_[i]; }

 private:
  std::vector<std::unique_ptr<StageEngine>> stages_;
};

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_PIPELINE_H_
