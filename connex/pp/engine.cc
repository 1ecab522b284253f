#include "connex/pp/engine.h"

#include <cmath>

#include "connex/base/check.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::pp {

absl::StatusOr<TensorDict> Engine::ExportState(uint64_t request_id, int64_t /*from*/,
                                               int64_t /*to*/) const {
  return absl::UnimplementedError(
      StrCat("this engine does not export request state (request ", request_id, ")"));
}

absl::Status Engine::ImportState(uint64_t request_id, int64_t /*from*/,
                                 const TensorDict& /*state*/) {
  return absl::UnimplementedError(
      StrCat("this engine does not import request state (request ", request_id, ")"));
}

absl::Status Engine::DropState(uint64_t request_id, int64_t from) {
  if (from == 0) {
    Release(request_id);
    return absl::OkStatus();
  }
  return absl::UnimplementedError(StrCat("this engine cannot cut request ", request_id,
                                         "'s state back to ", from, " positions"));
}

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

absl::Status Sampling::Validate() const {
  if (!(temperature >= 0 && temperature <= 2)) {
    return absl::InvalidArgumentError(
        StrCat("sampling temperature ", temperature, " is outside [0, 2]"));
  }
  if (!(top_p > 0 && top_p <= 1)) {
    return absl::InvalidArgumentError(StrCat("sampling top_p ", top_p, " is outside (0, 1]"));
  }
  if (top_k < 0)
    return absl::InvalidArgumentError(StrCat("sampling top_k ", top_k, " is negative"));
  if (!(min_p >= 0 && min_p <= 1)) {
    return absl::InvalidArgumentError(StrCat("sampling min_p ", min_p, " is outside [0, 1]"));
  }
  if (!(repetition_penalty > 0 && std::isfinite(repetition_penalty))) {
    return absl::InvalidArgumentError(
        StrCat("sampling repetition_penalty ", repetition_penalty, " is not a finite number > 0"));
  }
  return absl::OkStatus();
}

void SetSampling(TensorDict& dict, const std::vector<Sampling>& sampling) {
  const int64_t b = static_cast<int64_t>(sampling.size());
  std::vector<float> temperature, top_p, min_p, penalty;
  std::vector<int32_t> top_k;
  std::vector<int64_t> seed;
  for (const Sampling& s : sampling) {
    temperature.push_back(s.temperature);
    top_p.push_back(s.top_p);
    top_k.push_back(s.top_k);
    seed.push_back(static_cast<int64_t>(s.seed));
    min_p.push_back(s.min_p);
    penalty.push_back(s.repetition_penalty);
  }
  dict.Set(kSamplingMinP, Tensor::Of<float>({b}, min_p));
  dict.Set(kSamplingRepetitionPenalty, Tensor::Of<float>({b}, penalty));
  dict.Set(kSamplingTemperature, Tensor::Of<float>({b}, temperature));
  dict.Set(kSamplingTopP, Tensor::Of<float>({b}, top_p));
  dict.Set(kSamplingTopK, Tensor::Of<int32_t>({b}, top_k));
  dict.Set(kSamplingSeed, Tensor::Of<int64_t>({b}, seed));
}

absl::StatusOr<std::vector<Sampling>> GetSampling(const TensorDict& dict, int64_t batch_size) {
  const char* keys[] = {kSamplingTemperature, kSamplingTopP, kSamplingTopK, kSamplingSeed};
  int present = 0;
  for (const char* key : keys) present += dict.Find(key) != nullptr;
  std::vector<Sampling> out(static_cast<size_t>(batch_size));
  if (present == 0) return out;
  if (present != 4) {
    return absl::InvalidArgumentError(
        "a step carries some of the sampling keys but not all four (sampling.temperature, "
        "sampling.top_p, sampling.top_k, sampling.seed)");
  }
  CONNEX_ASSIGN_OR_RETURN(const Tensor* temperature,
                          dict.Get(kSamplingTemperature, DType::kF32, 1));
  CONNEX_ASSIGN_OR_RETURN(const Tensor* top_p, dict.Get(kSamplingTopP, DType::kF32, 1));
  CONNEX_ASSIGN_OR_RETURN(const Tensor* top_k, dict.Get(kSamplingTopK, DType::kI32, 1));
  CONNEX_ASSIGN_OR_RETURN(const Tensor* seed, dict.Get(kSamplingSeed, DType::kI64, 1));
  // The two later keys are optional: a step of an owner that predates them samples without.
  const Tensor* min_p = nullptr;
  const Tensor* penalty = nullptr;
  if (dict.Find(kSamplingMinP) != nullptr) {
    CONNEX_ASSIGN_OR_RETURN(min_p, dict.Get(kSamplingMinP, DType::kF32, 1));
  }
  if (dict.Find(kSamplingRepetitionPenalty) != nullptr) {
    CONNEX_ASSIGN_OR_RETURN(penalty, dict.Get(kSamplingRepetitionPenalty, DType::kF32, 1));
  }
  for (const Tensor* t : {temperature, top_p, top_k, seed, min_p, penalty}) {
    if (t != nullptr && t->shape[0] != batch_size) {
      return absl::InvalidArgumentError(
          StrCat("a sampling key has ", t->shape[0], " rows for a batch of ", batch_size));
    }
  }
  for (int64_t i = 0; i < batch_size; ++i) {
    Sampling& s = out[static_cast<size_t>(i)];
    s.temperature = temperature->values<float>()[i];
    s.top_p = top_p->values<float>()[i];
    s.top_k = top_k->values<int32_t>()[i];
    s.seed = static_cast<uint64_t>(seed->values<int64_t>()[i]);
    if (min_p != nullptr) s.min_p = min_p->values<float>()[i];
    if (penalty != nullptr) s.repetition_penalty = penalty->values<float>()[i];
    absl::Status ok = s.Validate();
    if (!ok.ok())
      return absl::InvalidArgumentError(StrCat("request ", i, " of the step: ", ok.message()));
  }
  return out;
}

void AddSamplingKeys(TensorDict& dict, const std::vector<Sampling>& sampling) {
  bool argmax = true, penalized = false;
  for (const Sampling& s : sampling) {
    argmax &= s.argmax();
    penalized |= s.penalized();
  }
  if (argmax) return;
  SetSampling(dict, sampling);
  if (!penalized) return;
  const Tensor* tokens = dict.Find(kTokens);
  CONNEX_CHECK(tokens != nullptr);  // the caller's contract
  dict.Set(kSamplingHistory, *tokens);
}

absl::StatusOr<const Tensor*> GetSamplingHistory(const TensorDict& dict, int64_t tokens) {
  if (dict.Find(kSamplingHistory) == nullptr) return nullptr;
  CONNEX_ASSIGN_OR_RETURN(const Tensor* history, dict.Get(kSamplingHistory, DType::kI32, 1));
  if (history->shape[0] != tokens) {
    return absl::InvalidArgumentError(StrCat(kSamplingHistory, " has ", history->shape[0],
                                             " rows for a step of ", tokens, " tokens"));
  }
  return history;
}

}  // namespace connex::pp
