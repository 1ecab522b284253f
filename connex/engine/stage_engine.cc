#include "connex/engine/stage_engine.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/kernels.h"
#include "connex/engine/rope.h"
#include "connex/engine/sampler.h"

namespace connex::engine {

struct StageEngine::Batch {
  std::vector<uint64_t> ids;
  std::vector<int64_t> start;
  std::vector<int64_t> count;
  std::vector<int64_t> first;      // index of each request's first token in [0, N)
  std::vector<int32_t> token_req;  // [N] request index of each token
  std::vector<int64_t> token_pos;  // [N] position of each token
  std::vector<float> rope_cos;     // [N, head_dim / 2]
  std::vector<float> rope_sin;
  int64_t tokens = 0;
};

namespace {

std::string LayerName(int64_t i, const char* leaf) { return StrCat("model.layers.", i, ".", leaf); }

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path) {
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(path));
  return ReadModelConfig(*checkpoint);
}

absl::StatusOr<ModelConfig> ReadModelConfig(const Checkpoint& checkpoint) {
  if (checkpoint.metadata().contains("hidden_size")) {
    absl::StatusOr<ModelConfig> config = ModelConfig::FromMetadata(checkpoint.metadata());
    if (!config.ok()) {
      return Annotate(config.status(), StrCat(checkpoint.shard_names()[0], ": __metadata__"));
    }
    return config;
  }
  const std::string json_path = StrCat(checkpoint.directory(), "/config.json");
  if (!IsFile(json_path)) {
    return absl::InvalidArgumentError(StrCat(
        checkpoint.shard_names()[0], ": no model config in __metadata__ and no ", json_path));
  }
  CONNEX_ASSIGN_OR_RETURN(std::string json, ReadText(json_path));
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(json);
  if (!config.ok()) return Annotate(config.status(), json_path);
  const std::string generation_path = StrCat(checkpoint.directory(), "/generation_config.json");
  if (IsFile(generation_path)) {
    CONNEX_ASSIGN_OR_RETURN(std::string text, ReadText(generation_path));
    if (absl::Status s = config->ApplyGenerationConfig(text); !s.ok()) {
      return Annotate(s, generation_path);
    }
  }
  return config;
}

StageEngine::~StageEngine() = default;

std::vector<WeightMatrix> StageEngine::StreamedWeights() const {
  std::vector<WeightMatrix> out;
  for (const Layer& l : weights_) {
    for (const WeightMatrix& w :
         {l.attn_norm, l.wq, l.wk, l.wv, l.wo, l.mlp_norm, l.w_gate, l.w_up, l.w_down}) {
      out.push_back(w);
    }
  }
  if (is_last()) {
    out.push_back(final_norm_);
    out.push_back(lm_head_);
  }
  return out;
}

absl::StatusOr<WeightMatrix> StageEngine::Weight(const std::string& name,
                                                 std::vector<int64_t> shape, bool streamed) {
  CONNEX_ASSIGN_OR_RETURN(SafetensorsFile::FloatTensor t, file_->MappedFloat(name, shape));
  if (streamed && copied_ != nullptr) {
    CONNEX_ASSIGN_OR_RETURN(std::span<const uint8_t> copy, copied_->Copy(t.bytes));
    if (t.mapped) ReleaseMappedPages(t.bytes);  // never a buffer's: MADV_DONTNEED zeroes those
    t.bytes = copy;
  }
  return WeightMatrix{t.bytes.data(), t.dtype, shape.size() == 2 ? shape[0] : 1, shape.back()};
}

absl::StatusOr<std::unique_ptr<StageEngine>> StageEngine::Load(const std::string& path,
                                                               const StageOptions& options) {
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(path));
  CONNEX_ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(*checkpoint));
  if (options.stages < 1 || options.stage < 0 || options.stage >= options.stages) {
    return absl::InvalidArgumentError(
        StrCat("stage ", options.stage, " of ", options.stages, " does not exist"));
  }
  if (options.layers) {
    const LayerRange r = *options.layers;
    if (r.begin < 0 || r.begin > r.end || r.end > config.num_hidden_layers) {
      return absl::InvalidArgumentError(StrCat("stage ", options.stage, ": layers [", r.begin, ", ",
                                               r.end, ") are not within the model's 0..",
                                               config.num_hidden_layers));
    }
  } else if (options.stages > config.num_hidden_layers) {
    return absl::InvalidArgumentError(StrCat("cannot split ", config.num_hidden_layers,
                                             " layers into ", options.stages, " stages"));
  }
  auto engine = std::unique_ptr<StageEngine>(new StageEngine());
  engine->config_ = config;
  engine->stage_ = options.stage;
  engine->stages_ = options.stages;
  engine->layers_ = options.layers
                        ? *options.layers
                        : StageLayers(config.num_hidden_layers, options.stage, options.stages);
  engine->file_ = std::move(checkpoint);
  WeightMemory weights = WeightMemory::kMapped;
  if (options.weights) {
    weights = *options.weights;
  } else {
    CONNEX_ASSIGN_OR_RETURN(weights, WeightMemoryFromEnv());
  }
  if (weights == WeightMemory::kCopied) engine->copied_ = std::make_unique<WeightArena>();

  const int64_t d = config.hidden_size, q = config.q_dim(), kv = config.kv_dim(),
                f = config.intermediate_size, v = config.vocab_size;
  auto load = [&](const std::string& name, std::vector<int64_t> shape, bool streamed = true) {
    absl::StatusOr<WeightMatrix> w = engine->Weight(name, std::move(shape), streamed);
    return w.ok() ? w : Annotate(w.status(), path);
  };
  auto load_bias = [&](const std::string& name, int64_t n) -> absl::StatusOr<std::vector<float>> {
    CONNEX_ASSIGN_OR_RETURN(WeightMatrix w, load(name, {n}, /*streamed=*/false));
    std::vector<float> values(n);
    WidenRow(w, 0, values.data());
    return values;
  };
  if (engine->is_first()) {
    // Read a row a token, unless it is also this stage's LM head (tied, one stage).
    const bool head_too = engine->is_last() && config.tie_word_embeddings;
    CONNEX_ASSIGN_OR_RETURN(engine->embed_, load("model.embed_tokens.weight", {v, d}, head_too));
  }
  for (int64_t i = engine->layers_.begin; i < engine->layers_.end; ++i) {
    Layer l;
    CONNEX_ASSIGN_OR_RETURN(l.attn_norm, load(LayerName(i, "input_layernorm.weight"), {d}));
    CONNEX_ASSIGN_OR_RETURN(l.wq, load(LayerName(i, "self_attn.q_proj.weight"), {q, d}));
    CONNEX_ASSIGN_OR_RETURN(l.wk, load(LayerName(i, "self_attn.k_proj.weight"), {kv, d}));
    CONNEX_ASSIGN_OR_RETURN(l.wv, load(LayerName(i, "self_attn.v_proj.weight"), {kv, d}));
    CONNEX_ASSIGN_OR_RETURN(l.wo, load(LayerName(i, "self_attn.o_proj.weight"), {d, q}));
    if (config.qkv_bias) {
      CONNEX_ASSIGN_OR_RETURN(l.bq, load_bias(LayerName(i, "self_attn.q_proj.bias"), q));
      CONNEX_ASSIGN_OR_RETURN(l.bk, load_bias(LayerName(i, "self_attn.k_proj.bias"), kv));
      CONNEX_ASSIGN_OR_RETURN(l.bv, load_bias(LayerName(i, "self_attn.v_proj.bias"), kv));
    }
    if (config.o_bias) {
      CONNEX_ASSIGN_OR_RETURN(l.bo, load_bias(LayerName(i, "self_attn.o_proj.bias"), d));
    }
    CONNEX_ASSIGN_OR_RETURN(l.mlp_norm, load(LayerName(i, "post_attention_layernorm.weight"), {d}));
    CONNEX_ASSIGN_OR_RETURN(l.w_gate, load(LayerName(i, "mlp.gate_proj.weight"), {f, d}));
    CONNEX_ASSIGN_OR_RETURN(l.w_up, load(LayerName(i, "mlp.up_proj.weight"), {f, d}));
    CONNEX_ASSIGN_OR_RETURN(l.w_down, load(LayerName(i, "mlp.down_proj.weight"), {d, f}));
    engine->weights_.push_back(l);
  }
  if (engine->is_last()) {
    CONNEX_ASSIGN_OR_RETURN(engine->final_norm_, load("model.norm.weight", {d}));
    if (!config.tie_word_embeddings) {
      CONNEX_ASSIGN_OR_RETURN(engine->lm_head_, load("lm_head.weight", {v, d}));
    } else if (engine->is_first()) {
      engine->lm_head_ = engine->embed_;  // tied, one stage: the same weights serve both ends
    } else {
      CONNEX_ASSIGN_OR_RETURN(engine->lm_head_, load("model.embed_tokens.weight", {v, d}));
    }
  }
  if (!RopeDependsOnPosition(config)) engine->inv_freq_ = RopeInverseFrequencies(config, 0);
  engine->pool_ = options.pool;
  if (!engine->pool_) {
    CONNEX_ASSIGN_OR_RETURN(int threads, EngineThreadsFromEnv());
    engine->pool_ = std::make_shared<ThreadPool>(threads);
  }
  return engine;
}

int64_t StageEngine::CachedPositions(uint64_t id) const {
  auto it = cache_.find(id);
  return it == cache_.end() ? -1 : it->second.positions;
}

absl::Status StageEngine::ParseBatch(const TensorDict& in, Batch& batch) const {
  CONNEX_ASSIGN_OR_RETURN(const Tensor* ids, in.Get(kRequestIds, DType::kI64, 1));
  CONNEX_ASSIGN_OR_RETURN(const Tensor* starts, in.Get(kStartPositions, DType::kI32, 1));
  CONNEX_ASSIGN_OR_RETURN(const Tensor* counts, in.Get(kNumTokens, DType::kI32, 1));
  const int64_t b = ids->shape[0];
  if (starts->shape[0] != b || counts->shape[0] != b) {
    return absl::InvalidArgumentError(
        StrCat("step: request_ids, start_positions and num_tokens have different lengths (", b,
               ", ", starts->shape[0], ", ", counts->shape[0], ")"));
  }
  absl::flat_hash_set<uint64_t> seen;
  for (int64_t i = 0; i < b; ++i) {
    uint64_t id = static_cast<uint64_t>(ids->values<int64_t>()[i]);
    int64_t start = starts->values<int32_t>()[i], count = counts->values<int32_t>()[i];
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(StrCat("step: request ", id, " appears twice"));
    }
    if (start < 0 || count < 1 || start + count > config_.max_positions()) {
      return absl::InvalidArgumentError(
          StrCat("step: request ", id, ": positions [", start, ", ", start + count,
                 ") are outside [0, ", config_.max_positions(), ") (the model's ",
                 config_.max_positions() == config_.max_position_embeddings
                     ? "max_position_embeddings"
                     : "max_position_embeddings x rope_scaling.factor",
                 ")"));
    }
    batch.ids.push_back(id);
    batch.start.push_back(start);
    batch.count.push_back(count);
    batch.first.push_back(batch.tokens);
    for (int64_t t = 0; t < count; ++t) {
      batch.token_req.push_back(static_cast<int32_t>(i));
      batch.token_pos.push_back(start + t);
    }
    batch.tokens += count;
  }
  if (is_first()) {
    CONNEX_ASSIGN_OR_RETURN(const Tensor* tokens, in.Get(kTokens, DType::kI32, 1));
    if (tokens->shape[0] != batch.tokens) {
      return absl::InvalidArgumentError(StrCat("step: 'tokens' has ", tokens->shape[0],
                                               " entries, num_tokens add up to ", batch.tokens));
    }
    for (int32_t t : tokens->values<int32_t>()) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            StrCat("step: token ", t, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
      }
    }
  } else {
    CONNEX_ASSIGN_OR_RETURN(const Tensor* hidden, in.Get(kHidden, DType::kF32, 2));
    if (hidden->shape[0] != batch.tokens || hidden->shape[1] != config_.hidden_size) {
      return absl::InvalidArgumentError(StrCat("step: 'hidden' has shape ",
                                               ShapeString(hidden->shape), ", expected [",
                                               batch.tokens, ", ", config_.hidden_size, "]"));
    }
  }
  const int64_t half = config_.head_dim() / 2;
  batch.rope_cos.resize(batch.tokens * half);
  batch.rope_sin.resize(batch.tokens * half);
  std::vector<float> inv_freq;
  for (int64_t t = 0; t < batch.tokens; ++t) {
    // Dynamic scaling's frequencies depend on the position (and on nothing else).
    if (inv_freq_.empty()) inv_freq = RopeInverseFrequencies(config_, batch.token_pos[t]);
    const std::vector<float>& freq = inv_freq_.empty() ? inv_freq : inv_freq_;
    for (int64_t i = 0; i < half; ++i) {
      // The angle in double, from the position alone: the same bits for a position wherever it
      // appears.
      double angle = static_cast<double>(batch.token_pos[t]) * static_cast<double>(freq[i]);
      batch.rope_cos[t * half + i] = static_cast<float>(std::cos(angle));
      batch.rope_sin[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> StageEngine::MissingRequests(const TensorDict& in) const {
  std::vector<uint64_t> missing;
  const Tensor* ids = in.Find(kRequestIds);
  const Tensor* starts = in.Find(kStartPositions);
  if (ids == nullptr || starts == nullptr || ids->dtype != DType::kI64 ||
      starts->dtype != DType::kI32 || ids->num_elements() != starts->num_elements()) {
    return missing;
  }
  for (int64_t i = 0; i < ids->num_elements(); ++i) {
    uint64_t id = static_cast<uint64_t>(ids->values<int64_t>()[i]);
    int64_t start = starts->values<int32_t>()[i];
    if (start > 0 && start > CachedPositions(id)) missing.push_back(id);
  }
  return missing;
}

absl::StatusOr<TensorDict> StageEngine::ExecuteStep(const TensorDict& in) {
  Batch batch;
  CONNEX_RETURN_IF_ERROR(ParseBatch(in, batch));
  CONNEX_ASSIGN_OR_RETURN(std::vector<Sampling> sampling,
                          GetSampling(in, static_cast<int64_t>(batch.ids.size())));
  std::vector<uint64_t> missing = MissingRequests(in);
  if (!missing.empty()) {
    std::string list;
    for (uint64_t id : missing) {
      list += StrCat(list.empty() ? "" : ", ", id, " (holds ",
                     std::max<int64_t>(CachedPositions(id), 0), " positions)");
    }
    return absl::NotFoundError(StrCat("stage ", stage_, ": missing KV cache for request ", list));
  }
  if (is_last()) {
    CONNEX_RETURN_IF_ERROR(history_.Check(in, batch.ids, batch.start, batch.count, sampling));
  }

  // From here on the step cannot fail.
  const int64_t n = batch.tokens, d = config_.hidden_size;
  // Insert every request first: flat_hash_map moves its values when it grows.
  for (uint64_t id : batch.ids) cache_.try_emplace(id);
  std::vector<RequestCache*> caches;
  for (size_t i = 0; i < batch.ids.size(); ++i) {
    RequestCache& c = cache_.find(batch.ids[i])->second;
    if (batch.start[i] == 0 || c.layers.size() != weights_.size()) {
      c = RequestCache();
      c.layers.resize(weights_.size());
    }
    c.positions = batch.start[i];
    for (LayerCache& l : c.layers) {
      l.k.resize(c.positions * config_.kv_dim());
      l.v.resize(c.positions * config_.kv_dim());
    }
    caches.push_back(&c);
  }

  std::vector<float> h(n * d);
  if (is_first()) {
    std::span<const int32_t> tokens = in.Find(kTokens)->values<int32_t>();
    for (int64_t t = 0; t < n; ++t) WidenRow(embed_, tokens[t], h.data() + t * d);
  } else {
    std::span<const float> hidden = in.Find(kHidden)->values<float>();
    std::copy(hidden.begin(), hidden.end(), h.begin());
  }
  for (size_t l = 0; l < weights_.size(); ++l) RunLayer(weights_[l], l, batch, caches, h);
  for (size_t i = 0; i < batch.ids.size(); ++i) caches[i]->positions += batch.count[i];

  TensorDict out;
  for (const char* key : {kRequestIds, kStartPositions, kNumTokens}) out.Set(key, *in.Find(key));
  if (!is_last()) {
    out.Set(kHidden, Tensor::Of<float>({n, d}, h));
    // The last stage samples: the requests' sampling goes on with the hidden states.
    for (const auto& [key, t] : in.tensors()) {
      if (key.starts_with(pp::kSamplingPrefix)) out.Set(key, t);
    }
    return out;
  }
  history_.Record(in, batch.ids, batch.start, batch.count, sampling);
  const int64_t b = static_cast<int64_t>(batch.ids.size()), v = config_.vocab_size;
  std::vector<float> last(b * d);
  for (int64_t i = 0; i < b; ++i) {
    int64_t t = batch.first[i] + batch.count[i] - 1;
    RmsNorm(h.data() + t * d, final_norm_, static_cast<float>(config_.rms_norm_eps),
            last.data() + i * d);
  }
  Tensor logits = Tensor::Zeros<float>({b, v});
  float* lp = logits.mutable_values<float>().data();
  MatMulOutput head[] = {{lm_head_, lp, v}};
  MatMul(*pool_, head, last.data(), b);
  std::vector<int32_t> next(b);
  for (int64_t i = 0; i < b; ++i) {
    // The token drawn is at position start + count: the request's length after this step.
    const uint64_t position = static_cast<uint64_t>(batch.start[i]) + batch.count[i];
    next[i] = SampleToken(std::span<const float>(lp + i * v, static_cast<size_t>(v)),
                          sampling[static_cast<size_t>(i)], position, history_.Of(batch.ids[i]));
  }
  out.Set(kLogits, std::move(logits));
  out.Set(kNextTokens, Tensor::Of<int32_t>({b}, next));
  return out;
}

void StageEngine::RunLayer(const Layer& w, size_t li, const Batch& batch,
                           std::vector<RequestCache*>& caches, std::vector<float>& h) {
  const int64_t n = batch.tokens, d = config_.hidden_size, hd = config_.head_dim(),
                heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads,
                qd = config_.q_dim(), kvd = config_.kv_dim(), f = config_.intermediate_size,
                half = hd / 2;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  ThreadPool& pool = *pool_;

  // Attention block.
  std::vector<float> xn(n * d);
  for (int64_t t = 0; t < n; ++t) RmsNorm(h.data() + t * d, w.attn_norm, eps, xn.data() + t * d);
  std::vector<float> q(n * qd), k(n * kvd), v(n * kvd);
  MatMulOutput qkv[] = {{w.wq, q.data(), qd}, {w.wk, k.data(), kvd}, {w.wv, v.data(), kvd}};
  MatMul(pool, qkv, xn.data(), n);
  if (!w.bq.empty()) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < qd; ++i) q[t * qd + i] += w.bq[i];
      for (int64_t i = 0; i < kvd; ++i) k[t * kvd + i] += w.bk[i];
      for (int64_t i = 0; i < kvd; ++i) v[t * kvd + i] += w.bv[i];
    }
  }
  auto rope = [&](float* vec, int64_t nheads, int64_t t) {
    const float* c = batch.rope_cos.data() + t * half;
    const float* s = batch.rope_sin.data() + t * half;
    for (int64_t hh = 0; hh < nheads; ++hh) {
      float* x = vec + hh * hd;
      for (int64_t i = 0; i < half; ++i) {
        float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c[i] - x1 * s[i];
        x[i + half] = x1 * c[i] + x0 * s[i];
      }
    }
  };
  for (int64_t t = 0; t < n; ++t) {
    rope(q.data() + t * qd, heads, t);
    rope(k.data() + t * kvd, kv_heads, t);
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    LayerCache& c = caches[i]->layers[li];
    const int64_t first = batch.first[i], count = batch.count[i];
    c.k.insert(c.k.end(), k.begin() + first * kvd, k.begin() + (first + count) * kvd);
    c.v.insert(c.v.end(), v.begin() + first * kvd, v.begin() + (first + count) * kvd);
  }
  std::vector<float> attn(n * qd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = heads / kv_heads, window = config_.sliding_window;
  pool.ParallelFor(n * heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      // One query (token t, head hh) against positions first..pos of its own request, in order:
      // first is 0, or with a sliding window the oldest of the last `window` positions.
      const int64_t t = item / heads, hh = item % heads;
      const LayerCache& c = caches[batch.token_req[t]]->layers[li];
      const int64_t pos = batch.token_pos[t], kvh = hh / group;
      const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      const float* qv = q.data() + t * qd + hh * hd;
      scores.resize(pos + 1);
      float max = -INFINITY;
      const float* keys = c.k.data() + kvh * hd;
      int64_t j = first;
      for (; j + 4 <= pos + 1; j += 4) {
        const float* rows[4] = {keys + j * kvd, keys + (j + 1) * kvd, keys + (j + 2) * kvd,
                                keys + (j + 3) * kvd};
        Dot4(rows, qv, hd, &scores[j]);
      }
      for (; j <= pos; ++j) scores[j] = Dot(keys + j * kvd, qv, hd);
      for (j = first; j <= pos; ++j) {
        scores[j] *= scale;
        max = std::max(max, scores[j]);
      }
      float sum = 0.0f;
      for (int64_t j = first; j <= pos; ++j) {
        scores[j] = std::exp(scores[j] - max);
        sum += scores[j];
      }
      float* out = attn.data() + t * qd + hh * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t j = first; j <= pos; ++j) {
        const float* vv = c.v.data() + j * kvd + kvh * hd;
        const float e = scores[j];
        for (int64_t i = 0; i < hd; ++i) out[i] += e * vv[i];
      }
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < hd; ++i) out[i] *= inv;
    }
  });
  std::vector<float> o(n * d);
  MatMulOutput proj[] = {{w.wo, o.data(), d}};
  MatMul(pool, proj, attn.data(), n);
  if (!w.bo.empty()) {
    for (int64_t i = 0; i < n * d; ++i) o[i] += w.bo[i % d];
  }
  for (int64_t i = 0; i < n * d; ++i) h[i] += o[i];

  // MLP block (SwiGLU).
  for (int64_t t = 0; t < n; ++t) RmsNorm(h.data() + t * d, w.mlp_norm, eps, xn.data() + t * d);
  std::vector<float> gate(n * f), up(n * f);
  MatMulOutput gu[] = {{w.w_gate, gate.data(), f}, {w.w_up, up.data(), f}};
  MatMul(pool, gu, xn.data(), n);
  for (int64_t i = 0; i < n * f; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
  MatMulOutput down[] = {{w.w_down, o.data(), d}};
  MatMul(pool, down, gate.data(), n);
  for (int64_t i = 0; i < n * d; ++i) h[i] += o[i];
}

}  // namespace connex::engine
