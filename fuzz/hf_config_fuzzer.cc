// libFuzzer target: a config.json of any bytes must give a ModelConfig or a Status, never crash,
// hang or overflow; what is accepted is then read as a generation_config.json too, and its RoPE
// frequencies computed at a few positions (dynamic scaling's depend on the position).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "connex/engine/model_config.h"
#include "connex/engine/rope.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace connex::engine;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(text);
  if (!config.ok()) return 0;
  (void)config->ApplyGenerationConfig(text);
  if (config->head_dim() <= 1024) {
    for (int64_t position :
         {int64_t{0}, config->max_position_embeddings, config->max_positions()}) {
      volatile float sink = RopeInverseFrequencies(*config, position).back();
      (void)sink;
    }
  }
  (void)ModelConfig::FromJson(config->ToJson());
  return 0;
}
