#include "connex/engine/generator.h"

#include <algorithm>

#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::engine {

absl::StatusOr<std::vector<Generation>> Generate(Pipeline& pipeline,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 const GenerateOptions& options,
                                                 uint64_t first_request_id) {
  struct Request {
    size_t index;
    uint64_t id;
    std::vector<int32_t> all;  // prompt + generated
    size_t prompt_size;
    int64_t cached = 0;  // positions in the KV cache
    bool recomputed = false;
  };
  std::vector<Generation> results(prompts.size());
  const int64_t limit = pipeline.config().max_positions();
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return absl::InvalidArgumentError(StrCat("prompt ", i, " is empty"));
    // The last token generated is never fed back: prompt + max_tokens - 1 positions are run.
    const int64_t positions =
        static_cast<int64_t>(prompts[i].size()) + std::max<int64_t>(options.max_tokens, 1) - 1;
    if (positions > limit) {
      return absl::InvalidArgumentError(
          StrCat("prompt ", i, ": ", prompts[i].size(), " tokens and up to ", options.max_tokens,
                 " generated need ", positions, " positions, more than the model's ", limit,
                 limit == pipeline.config().max_position_embeddings
                     ? " (max_position_embeddings)"
                     : " (max_position_embeddings x rope_scaling.factor)"));
    }
  }
  if (!options.sampling.empty() && options.sampling.size() != prompts.size()) {
    return absl::InvalidArgumentError(StrCat("sampling is given for ", options.sampling.size(),
                                             " of ", prompts.size(), " prompts"));
  }
  for (const Sampling& s : options.sampling) CONNEX_RETURN_IF_ERROR(s.Validate());
  if (options.max_tokens <= 0) return results;

  size_t next = 0;
  std::vector<Request> active;
  while (next < prompts.size() || !active.empty()) {
    while (next < prompts.size() &&
           (options.max_batch <= 0 || static_cast<int64_t>(active.size()) < options.max_batch)) {
      active.push_back({next, first_request_id + next, prompts[next], prompts[next].size()});
      ++next;
    }
    std::vector<int64_t> ids;
    std::vector<int32_t> starts, counts, tokens;
    for (const Request& r : active) {
      int64_t count = static_cast<int64_t>(r.all.size()) - r.cached;
      if (options.prefill_chunk > 0) count = std::min(count, options.prefill_chunk);
      ids.push_back(static_cast<int64_t>(r.id));
      starts.push_back(static_cast<int32_t>(r.cached));
      counts.push_back(static_cast<int32_t>(count));
      tokens.insert(tokens.end(), r.all.begin() + r.cached, r.all.begin() + r.cached + count);
    }
    const int64_t b = static_cast<int64_t>(active.size());
    TensorDict step;
    step.Set(kRequestIds, Tensor::Of<int64_t>({b}, ids));
    step.Set(kStartPositions, Tensor::Of<int32_t>({b}, starts));
    step.Set(kNumTokens, Tensor::Of<int32_t>({b}, counts));
    step.Set(kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(tokens.size())}, tokens));
    if (!options.sampling.empty()) {
      std::vector<Sampling> sampling;
      for (const Request& r : active) sampling.push_back(options.sampling[r.index]);
      SetSampling(step, sampling);
    }
    CONNEX_ASSIGN_OR_RETURN(TensorDict out, pipeline.Step(step));
    std::span<const int32_t> next_tokens = out.Find(kNextTokens)->values<int32_t>();
    std::span<const float> logits = out.Find(kLogits)->values<float>();
    const int64_t vocab = pipeline.config().vocab_size;

    std::vector<Request> still;
    for (int64_t i = 0; i < b; ++i) {
      Request& r = active[i];
      Generation& g = results[r.index];
      ++g.steps;
      r.cached += counts[i];
      if (r.cached < static_cast<int64_t>(r.all.size())) {  // a prefill chunk: no token yet
        still.push_back(std::move(r));
        continue;
      }
      int32_t token = next_tokens[i];
      r.all.push_back(token);
      g.tokens.push_back(token);
      if (options.keep_logits) {
        g.logits.emplace_back(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
      }
      bool done = static_cast<int64_t>(g.tokens.size()) >= options.max_tokens ||
                  (options.stop_at_eos && pipeline.config().IsEos(token));
      if (done) {
        pipeline.Release(r.id);
        continue;
      }
      if (options.recompute_at > 0 && !r.recomputed &&
          static_cast<int64_t>(g.tokens.size()) == options.recompute_at) {
        pipeline.Release(r.id);  // drop the KV cache; the next steps re-prefill everything
        r.cached = 0;
        r.recomputed = true;
        g.recomputed = true;
      }
      still.push_back(std::move(r));
    }
    active = std::move(still);
  }
  return results;
}

}  // namespace connex::engine
