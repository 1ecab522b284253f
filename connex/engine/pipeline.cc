#include "connex/engine/pipeline.h"

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/tensor_dict.h"

namespace connex::engine {

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Load(const std::string& path, int stages,
                                                         std::shared_ptr<ThreadPool> pool,
                                                         std::optional<WeightMemory> weights) {
  if (stages < 1) return absl::InvalidArgumentError(StrCat("--stages ", stages, " must be >= 1"));
  if (!pool) {
    CONNEX_ASSIGN_OR_RETURN(int threads, EngineThreadsFromEnv());
    pool = std::make_shared<ThreadPool>(threads);
  }
  auto pipeline = std::make_unique<Pipeline>();
  for (int s = 0; s < stages; ++s) {
    CONNEX_ASSIGN_OR_RETURN(
        std::unique_ptr<StageEngine> engine,
        StageEngine::Load(
            path, {.stage = s, .stages = stages, .pool = pool, .layers = {}, .weights = weights}));
    pipeline->stages_.push_back(std::move(engine));
  }
  return pipeline;
}

absl::StatusOr<TensorDict> Pipeline::Step(const TensorDict& in) {
  CONNEX_ASSIGN_OR_RETURN(TensorDict out, stages_.front()->ExecuteStep(in));
  for (size_t s = 1; s < stages_.size(); ++s) {
    // Through the step protocol's packing, as between two processes.
    std::vector<uint8_t> slot(pp::PackedSize(out));
    std::vector<pp::TensorLayout> layout = pp::Pack(out, slot.data());
    CONNEX_ASSIGN_OR_RETURN(TensorDict received, pp::Unpack(layout, slot.data(), slot.size()));
    CONNEX_ASSIGN_OR_RETURN(out, stages_[s]->ExecuteStep(received));
  }
  return out;
}

void Pipeline::Release(uint64_t id) {
  for (auto& s : stages_) s->Release(id);
}

}  // namespace connex::engine
