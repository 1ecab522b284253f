// Test helpers for Hugging Face model directories: a tiny config in each family's layout, a
// temporary directory removed at the end, and a prompt of token ids. Test-only.
#ifndef CONNEX_ENGINE_HF_TEST_UTIL_H_
#define CONNEX_ENGINE_HF_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "connex/engine/model_config.h"
#include "connex/engine/stage_engine.h"
#include "connex/engine/thread_pool.h"
#include "gtest/gtest.h"

namespace connex::engine::testing_hf {

// A 3-layer model of the given family, small enough for a float64 reference in Python: hidden
// 64, 4 heads of 16 over 2 KV heads (grouped), SwiGLU 96, vocabulary 300, 64 positions.
inline ModelConfig TinyHfConfig(const char* model_type = "llama") {
  ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 96;
  c.max_position_embeddings = 64;
  c.bos_token_id = 1;
  c.eos_token_ids = {2, 3};
  c.rms_norm_eps = 1e-6;
  c.qkv_bias = c.model_type == "qwen2";
  return c;
}

// `n` token ids in [4, vocab) from a fixed sequence (no BOS/EOS among them).
inline std::vector<int32_t> PromptTokens(int n, int64_t vocab, uint32_t seed = 7) {
  std::vector<int32_t> out;
  uint32_t x = seed;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<int32_t>(4 + (x >> 8) % static_cast<uint32_t>(vocab - 4)));
  }
  return out;
}

// Stage `stage` of `stages`, on a pool of one thread.
inline StageOptions StageAt(int stage, int stages) {
  StageOptions o;
  o.stage = stage;
  o.stages = stages;
  o.pool = std::make_shared<ThreadPool>(1);
  return o;
}

// A fresh directory under the test's temporary directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "/hf-model.XXXXXX";
    path_ = ::mkdtemp(pattern.data());
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace connex::engine::testing_hf

#endif  // CONNEX_ENGINE_HF_TEST_UTIL_H_
