// StageEngine: one pipeline stage of a Llama-architecture model on CPU (fp32), holding the KV
// cache of each request it serves. A step is a TensorDict in and a TensorDict out (the keys are
// below), so that stages chain by passing the output of one to the next. The results are
// batch- and prefill/decode-invariant: a request's hidden states, logits and tokens are
// bitwise the same whatever other requests share its steps, however its tokens are chunked,
// and however many threads run (docs/design/engine.md gives the argument).
// Thread-compatible: one caller at a time (the kernels use the engine's ThreadPool inside).
// It implements the engine contract, connex/pp/engine.h.
#ifndef CONNEX_ENGINE_STAGE_ENGINE_H_
#define CONNEX_ENGINE_STAGE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/engine/checkpoint.h"
#include "connex/engine/kernels.h"
#include "connex/engine/model_config.h"
#include "connex/engine/safetensors.h"
#include "connex/engine/sampler.h"
#include "connex/engine/tensor_dict.h"
#include "connex/engine/thread_pool.h"
#include "connex/engine/weight_memory.h"
#include "connex/pp/engine.h"

namespace connex::engine {

// Keys of a step's TensorDict (the contract's, connex/pp/engine.h, plus two of this engine).
// B requests, N = sum of num_tokens.
// In (every stage):  request_ids I64 [B], start_positions I32 [B], num_tokens I32 [B].
// In (stage 0):      tokens I32 [N] (each request's new tokens, requests in order).
// In (stage > 0):    hidden F32 [N, hidden_size] (the previous stage's output).
// Out (every stage): the three batch tensors, copied.
// In (optional):     the sampling keys (pp::Sampling): absent, every request is greedy.
// Out (not last):    hidden F32 [N, hidden_size], and every sampling.* key passed on.
// Out (last):        logits F32 [B, vocab_size] (of each request's last token) and
//                    next_tokens I32 [B] (greedy: argmax, lowest index on ties; sampled:
//                    SampleToken at the position start + count, see sampler.h).
using pp::GetSampling;
using pp::kNextTokens;
using pp::kNumTokens;
using pp::kRequestIds;
using pp::kSamplingSeed;
using pp::kSamplingTemperature;
using pp::kSamplingTopK;
using pp::kSamplingTopP;
using pp::kStartPositions;
using pp::kTokens;
using pp::Sampling;
using pp::SetSampling;
inline constexpr char kHidden[] = "hidden";
inline constexpr char kLogits[] = "logits";

// A request's state as data (ExportState / ImportState), for positions [from, to), R = to - from:
//   kv.<l>.k, kv.<l>.v  F32 [R, kv_dim] for each of the stage's layers, l = 0 .. its layer count
//                       - 1 (local indices): the cached K (RoPE applied) and V rows;
//   history             I32 [R] (last stage, when it holds the request's repetition-penalty
//                       tokens for those positions).
// 2 x layers x kv_dim x 4 bytes per position, + 4 with the history.
inline constexpr char kStateHistory[] = "history";
// "kv.<layer>.k" (leaf 'k') or "kv.<layer>.v".
std::string StateKey(int64_t layer, char leaf);

struct StageOptions {
  int stage = 0;
  int stages = 1;
  // Shared by the stages of one process; nullptr: the engine makes its own with
  // EngineThreadsFromEnv() threads.
  std::shared_ptr<ThreadPool> pool;
  // The layers this stage runs, when not StageLayers' even split: [begin, end) within the model's
  // (begin == end: none, only the embedding or the head). A prefill-decode frontend runs none
  // (the embedding alone) and its instances all of them (docs/design/pd.md).
  std::optional<LayerRange> layers;
  // Where the streamed weights live (weight_memory.h); nullopt: WeightMemoryFromEnv().
  std::optional<WeightMemory> weights;
};

// `path` is a .safetensors file or a Hugging Face model directory (Checkpoint::Open). The config
// comes from a single file's __metadata__ (connex-mkmodel's test models), else from config.json
// beside the weights, updated by generation_config.json when there is one. InvalidArgument
// names the file and the key.
absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path);
absl::StatusOr<ModelConfig> ReadModelConfig(const Checkpoint& checkpoint);

class StageEngine : public pp::Engine {
 public:
  // Loads the layer slice of `options.stage` (StageLayers), plus the embedding on stage 0 and the
  // final norm and LM head on the last stage (the embedding when the model ties them). Only the
  // shards holding these tensors are opened. Weights stay in the checkpoint's precision (F32, F16
  // or BF16; the kernels widen them in registers, with the same bits as a widened copy): the
  // checkpoint is mapped, and the weights a step streams are copied into memory of the engine's
  // own unless `options.weights` (or CONNEX_ENGINE_WEIGHTS) says mapped (weight_memory.h).
  // NotFound: no such file; InvalidArgument names the tensor or field that is wrong, or a bad
  // CONNEX_ENGINE_WEIGHTS.
  static absl::StatusOr<std::unique_ptr<StageEngine>> Load(const std::string& path,
                                                           const StageOptions& options);
  ~StageEngine() override;

  const ModelConfig& config() const { return config_; }
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == stages_ - 1; }
  LayerRange layers() const { return layers_; }
  const Checkpoint& checkpoint() const { return *file_; }
  // Where the streamed weights live, and the bytes copied (0 when mapped).
  WeightMemory weight_memory() const {
    return copied_ ? WeightMemory::kCopied : WeightMemory::kMapped;
  }
  int64_t copied_weight_bytes() const { return copied_ ? copied_->bytes() : 0; }
  // The weights a decode step reads whole, in the order it reads them: each layer's norms and
  // matrices, then, on the last stage, the final norm and the LM head. The embedding table, of
  // which a step reads a row a token, is among them only as the LM head of a tied model.
  std::vector<WeightMatrix> StreamedWeights() const;

  // Runs one step. A request whose start_position is 0 starts afresh (any cache it had is
  // dropped: this is how a request is recomputed); otherwise start_position must be at most the
  // number of positions cached (the cache is cut back to it). Before any state changes:
  // NotFound lists the requests whose state this stage does not hold (see MissingRequests);
  // InvalidArgument names a malformed input. On error nothing is modified.
  absl::StatusOr<TensorDict> ExecuteStep(const TensorDict& in) override;

  // The requests of step `in` whose KV cache this stage does not hold (start_position > cached
  // positions). Empty when the step can run.
  std::vector<uint64_t> MissingRequests(const TensorDict& in) const override;

  bool HoldsRequest(uint64_t id) const override { return cache_.contains(id); }
  // Positions cached for `id`; -1 when not held.
  int64_t CachedPositions(uint64_t id) const;
  // Drops a request's KV cache (finished, or to be recomputed). No-op when not held.
  void Release(uint64_t id) override {
    cache_.erase(id);
    history_.Release(id);
  }
  void ReleaseAll() {
    cache_.clear();
    history_.Clear();
  }
  // hidden_size fp32 values per token on every stage but the last (whose output is per request).
  uint64_t OutputBytesPerToken() const override {
    return is_last() ? 0 : static_cast<uint64_t>(config_.hidden_size) * sizeof(float);
  }
  size_t num_requests() const { return cache_.size(); }
  size_t NumHeldRequests() const override { return cache_.size(); }

  // ---- A request's state as data (the keys above; stage_engine_state.cc) ----
  bool ExportsState() const override { return true; }
  int64_t HeldPositions(uint64_t id) const override;
  // InvalidArgument unless 0 <= from < to; OutOfRange when fewer than `to` positions are held.
  absl::StatusOr<TensorDict> ExportState(uint64_t id, int64_t from, int64_t to) const override;
  // InvalidArgument names a missing, unknown or malformed key (dtype, shape against the config
  // and the stage's layers, rows that disagree, positions past max_positions); FailedPrecondition
  // when the request's held positions (or history, for a `history` key) are not exactly `from`.
  // On error nothing changes.
  absl::Status ImportState(uint64_t id, int64_t from, const TensorDict& state) override;
  // Cuts K, V, positions and history back to `from` (0: Release). InvalidArgument when negative.
  absl::Status DropState(uint64_t id, int64_t from) override;

 private:
  // Views into the mapped checkpoint or the copied weights; a norm is a matrix of one row.
  struct Layer {
    WeightMatrix attn_norm;
    WeightMatrix wq;
    WeightMatrix wk;
    WeightMatrix wv;
    WeightMatrix wo;
    // Biases, widened to fp32 at load (a few KB a layer): empty when the model has none.
    std::vector<float> bq;
    std::vector<float> bk;
    std::vector<float> bv;
    std::vector<float> bo;
    WeightMatrix mlp_norm;
    WeightMatrix w_gate;
    WeightMatrix w_up;
    WeightMatrix w_down;
  };
  struct LayerCache {
    std::vector<float> k;  // [positions, kv_dim], RoPE applied
    std::vector<float> v;  // [positions, kv_dim]
  };
  struct RequestCache {
    int64_t positions = 0;
    std::vector<LayerCache> layers;
  };
  struct Batch;

  StageEngine() = default;
  // `streamed`: read whole every step (a layer's matrices, the LM head), copied when the weights
  // are; the embedding table alone (a row a token) stays mapped.
  absl::StatusOr<WeightMatrix> Weight(const std::string& name, std::vector<int64_t> shape,
                                      bool streamed);
  absl::Status ParseBatch(const TensorDict& in, Batch& batch) const;
  void RunLayer(const Layer& layer, size_t local_index, const Batch& batch,
                std::vector<RequestCache*>& caches, std::vector<float>& h);
  // ImportState's checks: the rows of `state` (>= 1). InvalidArgument names the key.
  absl::StatusOr<int64_t> CheckState(uint64_t id, int64_t from, const TensorDict& state) const;

  ModelConfig config_;
  int stage_ = 0;
  int stages_ = 1;
  LayerRange layers_;
  std::unique_ptr<Checkpoint> file_;     // every weight is a view into its shards...
  std::unique_ptr<WeightArena> copied_;  // ...or, with copied weights, the streamed ones into this
  WeightMatrix embed_;
  WeightMatrix final_norm_;
  WeightMatrix lm_head_;
  std::vector<Layer> weights_;
  std::vector<float> inv_freq_;  // RoPE, [head_dim / 2], unless it depends on the position
  std::shared_ptr<ThreadPool> pool_;
  absl::flat_hash_map<uint64_t, RequestCache> cache_;
  TokenHistory history_;  // last stage: the repetition penalty's tokens, beside cache_
};

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_STAGE_ENGINE_H_
