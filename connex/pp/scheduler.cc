#include "connex/pp/scheduler.h"

#include <algorithm>

#include "connex/base/check.h"

namespace connex::pp {

std::vector<PlannedStep> PlanSteps(const std::vector<ReadyRequest>& ready,
                                   const StepLimits& limits) {
  CONNEX_CHECK(limits.max_batch >= 1 && limits.max_tokens >= 1);
  std::vector<PlannedStep> steps;
  size_t next = 0;
  while (next < ready.size() && steps.size() < limits.max_steps) {
    PlannedStep step;
    uint64_t tokens = 0;
    while (next < ready.size() && step.ids.size() < limits.max_batch &&
           tokens < limits.max_tokens) {
      const ReadyRequest& r = ready[next++];
      CONNEX_CHECK(r.cached < r.total);  // a ready request has something to send
      const uint64_t want = r.total - r.cached;
      const uint64_t take = std::min<uint64_t>(want, limits.max_tokens - tokens);
      if (take < want) ++step.chunked;
      step.ids.push_back(r.id);
      step.ends.push_back(r.cached + take);
      tokens += take;
    }
    steps.push_back(std::move(step));
  }
  return steps;
}

uint64_t MaxStepTokens(uint64_t engine_bytes_per_token, uint64_t measured_bytes_per_token,
                       uint64_t payload_capacity, uint64_t overhead, uint32_t stages) {
  const uint64_t per_token = std::max(engine_bytes_per_token, measured_bytes_per_token);
  if (per_token == 0 || stages == 1) return UINT64_MAX;
  const uint64_t budget =
      payload_capacity > overhead ? payload_capacity - overhead : payload_capacity / 2;
  return std::max<uint64_t>(1, budget / per_token);
}

TensorDict StepInput(const std::vector<uint64_t>& ids, const std::vector<int32_t>& starts,
                     const std::vector<int32_t>& counts, const std::vector<int32_t>& tokens,
                     const std::vector<Sampling>& sampling) {
  CONNEX_CHECK(starts.size() == ids.size() && counts.size() == ids.size() &&
               sampling.size() == ids.size());
  TensorDict in;
  SetBatch(in, ids, starts, counts);
  in.Set(kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(tokens.size())}, tokens));
  AddSamplingKeys(in, sampling);
  return in;
}

uint64_t MeasuredBytesPerToken(const TensorDict& out, size_t tokens) {
  if (tokens == 0) return 0;
  const int64_t n = static_cast<int64_t>(tokens);
  uint64_t per_token = 0;
  for (const auto& [name, t] : out.tensors()) {
    if (name == kRequestIds || name == kStartPositions || name == kNumTokens) continue;
    if (!t.shape.empty() && t.shape[0] == n) per_token += t.data.size() / tokens;
  }
  return per_token;
}

}  // namespace connex::pp
