// Copied weights (CONNEX_ENGINE_WEIGHTS=copied): the setting's errors, what a stage copies (the
// matrices it streams, not the embedding table it reads a row of), and the same bits as mapped
// weights over 1, 2 and 3 stages, tied and untied, BF16 and F32.
#include "connex/engine/weight_memory.h"

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "connex/engine/generator.h"
#include "connex/engine/hf_model_writer.h"
#include "connex/engine/hf_test_util.h"
#include "connex/engine/pipeline.h"
#include "connex/engine/safetensors.h"
#include "connex/engine/stage_engine.h"
#include "gmock/gmock.h"

namespace connex::engine {
namespace {

using ::testing::HasSubstr;
using testing_hf::PromptTokens;
using testing_hf::StageAt;
using testing_hf::TempDir;
using testing_hf::TinyHfConfig;

// Sets CONNEX_ENGINE_WEIGHTS for the scope (nullptr: unsets it), then puts back what was there.
class ScopedWeightsEnv {
 public:
  explicit ScopedWeightsEnv(const char* value) {
    if (const char* old = std::getenv("CONNEX_ENGINE_WEIGHTS")) old_ = old;
    if (value != nullptr) {
      ::setenv("CONNEX_ENGINE_WEIGHTS", value, 1);
    } else {
      ::unsetenv("CONNEX_ENGINE_WEIGHTS");
    }
  }
  ~ScopedWeightsEnv() {
    if (old_) {
      ::setenv("CONNEX_ENGINE_WEIGHTS", old_->c_str(), 1);
    } else {
      ::unsetenv("CONNEX_ENGINE_WEIGHTS");
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST(WeightMemoryTest, TheSettingTakesItsTwoNamesAndRefusesOthersByName) {
  EXPECT_EQ(*ParseWeightMemory("mapped"), WeightMemory::kMapped);
  EXPECT_EQ(*ParseWeightMemory("copied"), WeightMemory::kCopied);
  EXPECT_EQ(WeightMemoryName(WeightMemory::kCopied), "copied");
  {
    ScopedWeightsEnv unset(nullptr);
    EXPECT_EQ(*WeightMemoryFromEnv(), WeightMemory::kCopied);
  }
  {
    ScopedWeightsEnv env("mmap");
    absl::StatusOr<WeightMemory> m = WeightMemoryFromEnv();
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("CONNEX_ENGINE_WEIGHTS=mmap"));
    // A model does not load with it: the engine says why.
    TempDir dir;
    HfModelOptions o;
    ASSERT_TRUE(WriteRandomHfModel(dir.path(), TinyHfConfig(), o).ok());
    absl::StatusOr<std::unique_ptr<StageEngine>> engine =
        StageEngine::Load(dir.path(), StageAt(0, 1));
    ASSERT_FALSE(engine.ok());
    EXPECT_THAT(engine.status().message(), HasSubstr("CONNEX_ENGINE_WEIGHTS=mmap"));
  }
}

TEST(WeightMemoryTest, AnArenaCopiesAlignedAndGrowsPastAChunk) {
  WeightArena arena(/*chunk_bytes=*/size_t{4} << 20);
  std::vector<uint8_t> small(100, 7), big((size_t{4} << 20) + 3, 9);
  absl::StatusOr<std::span<const uint8_t>> a = arena.Copy(small);
  absl::StatusOr<std::span<const uint8_t>> b = arena.Copy(small);
  absl::StatusOr<std::span<const uint8_t>> c = arena.Copy(big);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  EXPECT_GE(b->data(), a->data() + 100);
  EXPECT_TRUE(std::equal(a->begin(), a->end(), small.begin()));
  EXPECT_EQ(c->size(), big.size());  // a chunk of its own, past the first
  EXPECT_TRUE(c->data() + c->size() <= a->data() || c->data() >= b->data() + b->size());
  EXPECT_EQ((*c)[big.size() - 1], 9);
  EXPECT_EQ(arena.bytes(), static_cast<int64_t>(2 * small.size() + big.size()));
}

// A stage copies the matrices it streams (its layers', the LM head), not the embedding table it
// reads a row of per token, unless that is its LM head too (tied, one stage).
TEST(WeightMemoryTest, AStageCopiesWhatItStreams) {
  TempDir dir;
  ModelConfig c = TinyHfConfig();
  c.tie_word_embeddings = true;
  HfModelOptions o;
  o.dtype = DType::kBF16;
  ASSERT_TRUE(WriteRandomHfModel(dir.path(), c, o).ok());
  auto file = SafetensorsFile::Open(dir / kSingleFile);
  ASSERT_TRUE(file.ok()) << file.status();
  auto bytes_of = [&](const std::string& prefix) {
    int64_t n = 0;
    for (const auto& [name, t] : (*file)->header().tensors) {
      if (name.rfind(prefix, 0) == 0) n += static_cast<int64_t>(t.end - t.begin);
    }
    return n;
  };
  const int64_t embed = bytes_of("model.embed_tokens."), norm = bytes_of("model.norm.");
  auto layers_bytes = [&](LayerRange r) {
    int64_t n = 0;
    for (int64_t i = r.begin; i < r.end; ++i)
      n += bytes_of("model.layers." + std::to_string(i) + ".");
    return n;
  };
  for (int stages : {1, 2}) {
    for (int s = 0; s < stages; ++s) {
      StageOptions so = StageAt(s, stages);
      so.weights = WeightMemory::kCopied;
      auto engine = StageEngine::Load(dir.path(), so);
      ASSERT_TRUE(engine.ok()) << engine.status();
      EXPECT_EQ((*engine)->weight_memory(), WeightMemory::kCopied);
      const bool last = s == stages - 1;
      EXPECT_EQ((*engine)->copied_weight_bytes(),
                layers_bytes((*engine)->layers()) + (last ? embed + norm : 0))
          << "stage " << s << " of " << stages;
      so.weights = WeightMemory::kMapped;
      auto mapped = StageEngine::Load(dir.path(), so);
      ASSERT_TRUE(mapped.ok()) << mapped.status();
      EXPECT_EQ((*mapped)->copied_weight_bytes(), 0);
      // What a decode step streams is what is copied, mapped or not: 9 tensors a layer, then the
      // final norm and the LM head on the last stage.
      for (const StageEngine* e : {engine->get(), mapped->get()}) {
        const std::vector<WeightMatrix> streamed = e->StreamedWeights();
        int64_t bytes = 0;
        for (const WeightMatrix& w : streamed) bytes += w.bytes();
        EXPECT_EQ(bytes, (*engine)->copied_weight_bytes()) << "stage " << s << " of " << stages;
        EXPECT_EQ(static_cast<int64_t>(streamed.size()),
                  9 * (e->layers().end - e->layers().begin) + (last ? 2 : 0));
      }
    }
  }
}

// The same logits and tokens, bit for bit, as the mapped weights: the copy is of bytes.
TEST(WeightMemoryTest, CopiedWeightsGiveTheBitsOfMappedOnes) {
  for (bool tied : {true, false}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      TempDir dir;
      ModelConfig c = TinyHfConfig("qwen2");  // biases too
      c.tie_word_embeddings = tied;
      HfModelOptions o;
      o.dtype = dtype;
      o.shard_size = 60'000;  // sharded: tensors of several files
      ASSERT_TRUE(WriteRandomHfModel(dir.path(), c, o).ok());
      GenerateOptions g;
      g.max_tokens = 8;
      g.stop_at_eos = false;
      g.max_batch = 2;
      g.keep_logits = true;
      const std::vector<std::vector<int32_t>> prompts = {PromptTokens(9, c.vocab_size),
                                                         PromptTokens(5, c.vocab_size, 3)};
      std::optional<ScopedWeightsEnv> mapped_env(std::in_place, "mapped");
      auto mapped = Pipeline::Load(dir.path(), 1, std::make_shared<ThreadPool>(1));
      ASSERT_TRUE(mapped.ok()) << mapped.status();
      auto expected = Generate(**mapped, prompts, g);
      ASSERT_TRUE(expected.ok()) << expected.status();
      mapped_env.reset();
      ScopedWeightsEnv env("copied");
      for (int stages : {1, 2, 3}) {
        auto copied = Pipeline::Load(dir.path(), stages, std::make_shared<ThreadPool>(2));
        ASSERT_TRUE(copied.ok()) << copied.status();
        auto got = Generate(**copied, prompts, g);
        ASSERT_TRUE(got.ok()) << got.status();
        for (size_t i = 0; i < prompts.size(); ++i) {
          SCOPED_TRACE(testing::Message() << "tied " << tied << ", " << DTypeName(dtype) << ", "
                                          << stages << " stages, prompt " << i);
          EXPECT_EQ((*got)[i].tokens, (*expected)[i].tokens);
          ASSERT_EQ((*got)[i].logits.size(), (*expected)[i].logits.size());
          for (size_t t = 0; t < (*got)[i].logits.size(); ++t) {
            EXPECT_EQ(0, std::memcmp((*got)[i].logits[t].data(), (*expected)[i].logits[t].data(),
                                     (*got)[i].logits[t].size() * sizeof(float)));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace connex::engine
