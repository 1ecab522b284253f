#include "connex/pp/engine.h"

#include "connex/base/strings.h"

namespace connex::pp {

void SetBatch(TensorDict& dict, const std::vector<uint64_t>& request_ids,
              const std::vector<int32_t>& start_positions, const std::vector<int32_t>& num_tokens) {
  const int64_t b = static_cast<int64_t>(request_ids.size());
  std::vector<int64_t> ids(request_ids.begin(), request_ids.end());
  dict.Set(kRequestIds, Tensor::Of<int64_t>({b}, ids));
  dict.Set(kStartPositions, Tensor::Of<int32_t>({b}, start_positions));
  dict.Set(kNumTokens, Tensor::Of<int32_t>({b}, num_tokens));
}

absl::StatusOr<Batch> GetBatch(const TensorDict& dict) {
  absl::StatusOr<const Tensor*> ids = dict.Get(kRequestIds, DType::kI64, 1);
  if (!ids.ok()) return ids.status();
  absl::StatusOr<const Tensor*> starts = dict.Get(kStartPositions, DType::kI32, 1);
  if (!starts.ok()) return starts.status();
  absl::StatusOr<const Tensor*> counts = dict.Get(kNumTokens, DType::kI32, 1);
  if (!counts.ok()) return counts.status();
  const int64_t b = (*ids)->shape[0];
  if ((*starts)->shape[0] != b || (*counts)->shape[0] != b) {
    return absl::InvalidArgumentError(StrCat("batch keys disagree on the batch size: ", b, ", ",
                                             (*starts)->shape[0], ", ", (*counts)->shape[0]));
  }
  Batch batch;
  for (int64_t v : (*ids)->values<int64_t>()) batch.request_ids.push_back(static_cast<uint64_t>(v));
  for (int32_t v : (*starts)->values<int32_t>()) {
    if (v < 0) return absl::InvalidArgumentError(StrCat("start_positions has ", v));
    batch.start_positions.push_back(v);
  }
  for (int32_t v : (*counts)->values<int32_t>()) {
    if (v <= 0) return absl::InvalidArgumentError(StrCat("num_tokens has ", v));
    batch.num_tokens.push_back(v);
  }
  return batch;
}

}  // namespace connex::pp
