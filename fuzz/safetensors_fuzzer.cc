// libFuzzer target: a safetensors file of any bytes must give a Status, never crash, hang or read
// out of bounds — header parsing, tensor reads (with dtype conversion) and the model config in
// __metadata__.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "connex/engine/model_config.h"
#include "connex/engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace connex::engine;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::FromBytes(std::vector<uint8_t>(data, data + size));
  if (!file.ok()) return 0;
  for (const auto& [name, info] : (*file)->header().tensors) {
    absl::StatusOr<std::vector<float>> values = (*file)->ReadF32(name, info.shape);
    if (values.ok() && !values->empty()) {
      volatile float sink = (*values)[values->size() - 1];
      (void)sink;
    }
    (void)(*file)->ReadTensor(name);
    (void)(*file)->MappedFloat(name, info.shape);
  }
  (void)ModelConfig::FromMetadata((*file)->metadata());
  return 0;
}
