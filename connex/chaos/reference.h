// What every campaign compares with: connex-generate's tokens for the same prompt, max_tokens
// and sampling (the single-process reference run of the engine). Computed once per distinct
// request, in batches (one connex-generate per sampling setting; the engine is batch-invariant).
// Thread-compatible.
#ifndef CONNEX_CHAOS_REFERENCE_H_
#define CONNEX_CHAOS_REFERENCE_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"

namespace connex::chaos {

// One request of a campaign's load.
struct RequestSpec {
  std::string prompt;  // the completion's prompt (a chat's: its rendered template)
  int max_tokens = 32;
  float temperature = 0;  // 0: greedy
  float top_p = 1;        // < 1: nucleus sampling, with temperature > 0
  uint64_t seed = 0;      // with temperature > 0
  // vLLM's fields (sent when not their default; connex-generate's flags of the same names).
  float min_p = 0;
  float repetition_penalty = 1;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids = {};
  // The /v1/completions body, streamed, with usage.
  std::string Body(const std::string& model) const;
  // The token that ends this request by its own rule: EOS unless ignored, a stop_token_ids one.
  bool Stops(int32_t token) const;
  auto Key() const {
    return std::tie(prompt, max_tokens, temperature, top_p, seed, min_p, repetition_penalty,
                    ignore_eos, stop_token_ids);
  }
};

// connex-generate's answer to one request.
struct Reference {
  std::vector<int32_t> tokens;
  std::string text;           // invalid UTF-8 replaced by U+FFFD, as the API does
  int64_t prompt_tokens = 0;  // the prompt's ids, as the model's tokenizer makes them
  std::string finish_reason;  // "stop" (a stop token ended it) or "length"
};

class References {
 public:
  // `generate`: the connex-generate binary; `stages`: as the deployment runs the model.
  References(std::string generate, std::string model_path, uint32_t stages, std::string work_dir)
      : generate_(std::move(generate)),
        model_path_(std::move(model_path)),
        stages_(stages),
        work_dir_(std::move(work_dir)) {}
  // Computes the references of every spec not known yet: one connex-generate per sampling
  // setting (a single-threaded engine each), as many at once as the machine has cores.
  absl::Status Compute(const std::vector<RequestSpec>& specs);
  // The reference of `spec` (Compute first); nullptr if unknown.
  const Reference* Find(const RequestSpec& spec) const;

 private:
  using Key = std::tuple<std::string, int, float, float, uint64_t, float, float, bool,
                         std::vector<int32_t>>;
  // One connex-generate run: `prompts` with the sampling of `sampling`.
  struct Run {
    RequestSpec sampling;
    std::vector<std::string> prompts;
  };
  // Runs `run` (the `id`th connex-generate of this object, for its files' names): its lines, one
  // per prompt. Touches no member but the constant ones: runs go on side by side.
  absl::StatusOr<std::vector<Reference>> Generate(const Run& run, int id) const;
  std::string generate_, model_path_;
  uint32_t stages_;
  std::string work_dir_;
  std::map<Key, Reference> known_;
  int runs_ = 0;  // connex-generate runs so far, for their files' names
};

// How `got` compares with `want`: tokens compared (the longer of the two lengths) and how many
// of them differ, a token missing on either side counted as mismatched.
struct Comparison {
  int64_t compared = 0;
  int64_t mismatched = 0;
};
Comparison CompareTokens(const std::vector<int32_t>& got, const std::vector<int32_t>& want);

}  // namespace connex::chaos

#endif  // CONNEX_CHAOS_REFERENCE_H_
