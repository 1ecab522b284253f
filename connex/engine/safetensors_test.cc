#include "connex/engine/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "connex/engine/half.h"
#include "connex/engine/hf_test_util.h"
#include "connex/engine/model_config.h"
#include "connex/engine/random_model.h"
#include "connex/engine/stage_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::engine {
namespace {

using ::testing::HasSubstr;
using testing_hf::StageAt;
using Metadata = std::map<std::string, std::string, std::less<>>;

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/" + name + "." + std::to_string(::getpid());
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TensorDict SampleTensors() {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> a(6 * 5), b(7);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  b[0] = 0.0f;
  b[1] = -0.0f;
  b[2] = 1e-30f;  // below F16's range: flushes to zero there
  TensorDict dict;
  dict.Set("model.layers.0.self_attn.q_proj.weight", Tensor::Of<float>({6, 5}, a));
  dict.Set("model.norm.weight", Tensor::Of<float>({7}, b));
  dict.Set("empty", Tensor::Zeros<float>({0, 3}));
  return dict;
}

TEST(HalfTest, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = F16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToF16(f), h) << std::hex << h;
  }
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(NAN))));
}

#if defined(__FLT16_MAX__) && !defined(__clang__)
TEST(HalfTest, F16RoundingMatchesTheCompiler) {
  std::mt19937 rng(9);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    ASSERT_EQ(FloatToF16(f), bits) << f;
  }
}
#endif

TEST(HalfTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  float halfway = std::bit_cast<float>(0x3f808000u);  // between 0x3f80 and 0x3f81
  EXPECT_EQ(FloatToBF16(halfway), 0x3f80);            // ties to even
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(NAN))));
}

TEST(SafetensorsTest, F32RoundTripIsExactAndMapped) {
  TensorDict dict = SampleTensors();
  Metadata meta = {{"hello", "world"}};
  std::string path = TempPath("f32.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, dict, meta).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), meta);
  for (const auto& [name, tensor] : dict.tensors()) {
    auto read = (*file)->ReadTensor(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, tensor) << name;
    auto f32 = (*file)->ReadF32(name, tensor.shape);
    ASSERT_TRUE(f32.ok());
    ASSERT_EQ(f32->size() * sizeof(float), tensor.data.size());
    if (!f32->empty()) {
      EXPECT_EQ(std::memcmp(f32->data(), tensor.data.data(), tensor.data.size()), 0);
    }
  }
  const Tensor& q = dict.tensors().at("model.layers.0.self_attn.q_proj.weight");
  auto mapped = (*file)->MappedFloat("model.layers.0.self_attn.q_proj.weight", q.shape);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->dtype, DType::kF32);
  ASSERT_EQ(mapped->bytes.size(), q.data.size());
  EXPECT_EQ(std::memcmp(mapped->bytes.data(), q.data.data(), q.data.size()), 0);
  std::vector<int64_t> wrong = {5, 6};
  auto misshapen = (*file)->MappedFloat("model.layers.0.self_attn.q_proj.weight", wrong);
  EXPECT_THAT(misshapen.status().message(), HasSubstr("expected [5, 6]"));
  ::unlink(path.c_str());
}

TEST(SafetensorsTest, F16AndBF16RoundTrip) {
  TensorDict dict = SampleTensors();
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    TensorDict converted;
    for (const auto& [name, t] : dict.tensors()) converted.Set(name, ConvertF32(t, dtype));
    std::string path = TempPath(std::string(DTypeName(dtype)) + ".safetensors");
    ASSERT_TRUE(WriteSafetensors(path, converted, {}).ok());
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    for (const auto& [name, t] : dict.tensors()) {
      EXPECT_EQ((*file)->Find(name)->dtype, dtype);
      EXPECT_EQ(*(*file)->ReadTensor(name), converted.tensors().at(name));
      auto f32 = (*file)->ReadF32(name, t.shape);
      ASSERT_TRUE(f32.ok()) << f32.status();
      std::span<const float> original = t.values<float>();
      for (size_t i = 0; i < original.size(); ++i) {
        float expected = dtype == DType::kF16 ? F16ToFloat(FloatToF16(original[i]))
                                              : BF16ToFloat(FloatToBF16(original[i]));
        ASSERT_EQ(Bits((*f32)[i]), Bits(expected)) << name << "[" << i << "]";
        // Within the format's relative precision (F16: values here are normal or flushed).
        float tolerance = dtype == DType::kF16 ? 1e-3f : 8e-3f;
        if (std::fabs(original[i]) > 1e-4f) {
          EXPECT_NEAR((*f32)[i], original[i], tolerance * std::fabs(original[i]));
        }
      }
      // In place, in the file's precision: the kernels widen it in registers.
      auto mapped = (*file)->MappedFloat(name, t.shape);
      ASSERT_TRUE(mapped.ok()) << mapped.status();
      EXPECT_EQ(mapped->dtype, dtype);
      const std::vector<uint8_t>& raw = converted.tensors().at(name).data;
      ASSERT_EQ(mapped->bytes.size(), raw.size());
      EXPECT_TRUE(std::equal(raw.begin(), raw.end(), mapped->bytes.begin())) << name;
    }
    ::unlink(path.c_str());
  }
}

// A valid file's bytes, then `edit` applied to its header text.
std::vector<uint8_t> WithHeader(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string ParseError(const std::vector<uint8_t>& bytes) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(bytes);
  EXPECT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(h.status().message());
}

TEST(SafetensorsTest, CorruptHeadersNameTheCulprit) {
  EXPECT_THAT(ParseError({1, 2, 3}), HasSubstr("too short"));
  std::vector<uint8_t> huge = WithHeader("{}", 0);
  huge[5] = 1;
  EXPECT_THAT(ParseError(huge), HasSubstr("exceeds the limit"));
  std::vector<uint8_t> past = WithHeader("{}", 0);
  past[0] = 50;
  EXPECT_THAT(ParseError(past), HasSubstr("beyond the end of the file"));
  EXPECT_THAT(ParseError(WithHeader("{\"a\": ", 0)), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError(WithHeader("[1, 2]", 0)), HasSubstr("not a JSON object"));
  EXPECT_THAT(
      ParseError(WithHeader(R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8)),
      HasSubstr("tensor 'w': unsupported dtype 'F64'"));
  EXPECT_THAT(ParseError(WithHeader(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'w': field 'dtype'"));
  EXPECT_THAT(ParseError(WithHeader(
                  R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4)),
              HasSubstr("tensor 'w': a dimension of 'shape'"));
  EXPECT_THAT(
      ParseError(WithHeader(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4)),
      HasSubstr("tensor 'w': data_offsets cover 4 bytes but F32 [2] needs 8"));
  EXPECT_THAT(
      ParseError(WithHeader(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4)),
      HasSubstr("beyond the data section"));
  EXPECT_THAT(
      ParseError(WithHeader(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4)),
      HasSubstr("reversed"));
  EXPECT_THAT(ParseError(WithHeader(
                  R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296]}})", 4)),
              HasSubstr("tensor 'w': shape"));
  EXPECT_THAT(ParseError(WithHeader(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                    8)),
              HasSubstr("overlap"));
  EXPECT_THAT(ParseError(WithHeader(R"({"__metadata__": {"k": 1}})", 0)),
              HasSubstr("__metadata__ 'k' is not a string"));
}

// The tensors must tile the data section: a header length off by one (the header ends in padding,
// so its JSON still parses) shifts every tensor by a byte and leaves a byte no tensor covers.
TEST(SafetensorsTest, HeaderLengthMustEndWhereTheDataStarts) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}  )";
  std::vector<uint8_t> exact = WithHeader(header, 4);
  ASSERT_TRUE(ParseSafetensorsHeader(exact).ok());
  std::vector<uint8_t> short_by_one = exact;
  short_by_one[0] -= 1;
  EXPECT_THAT(ParseError(short_by_one),
              HasSubstr("the data section is 5 bytes but the tensors cover 4: 1 trailing bytes "
                        "belong to no tensor"));
  std::vector<uint8_t> long_by_one = exact;
  long_by_one[0] += 1;
  EXPECT_FALSE(ParseSafetensorsHeader(long_by_one).ok());
  // A real checkpoint with its header length one short: refused whatever its last header byte.
  std::vector<uint8_t> bytes = SerializeSafetensors(SampleTensors(), {{"k", "v"}});
  ASSERT_TRUE(ParseSafetensorsHeader(bytes).ok());
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[i];
  for (int shift : {-8, -1, 1, 8}) {
    std::vector<uint8_t> off = bytes;
    for (int i = 0; i < 8; ++i) off[i] = static_cast<uint8_t>((length + shift) >> (8 * i));
    EXPECT_FALSE(ParseSafetensorsHeader(off).ok()) << shift;
  }
}

TEST(SafetensorsTest, EveryDataByteBelongsToExactlyOneTensor) {
  EXPECT_THAT(ParseError(WithHeader(
                  R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 12)),
              HasSubstr("8 trailing bytes belong to no tensor"));
  EXPECT_THAT(ParseError(WithHeader(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                                    12)),
              HasSubstr("bytes [4, 8) of the data section belong to no tensor (a hole before "
                        "tensor 'b')"));
  EXPECT_THAT(
      ParseError(WithHeader(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8)),
      HasSubstr("bytes [0, 4)"));
  EXPECT_THAT(ParseError(WithHeader("{}", 1)), HasSubstr("1 trailing bytes"));
  // Empty tensors take no bytes and may sit anywhere inside the section.
  EXPECT_TRUE(ParseSafetensorsHeader(
                  WithHeader(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                 "e": {"dtype": "F32", "shape": [0], "data_offsets": [2, 2]}})",
                             4))
                  .ok());
}

TEST(SafetensorsTest, OpenNamesTheFileOfAMisdeclaredHeader) {
  std::vector<uint8_t> bytes =
      WithHeader(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}  )", 4);
  bytes[0] -= 1;
  std::string path =
      ::testing::TempDir() + "/short-header." + std::to_string(::getpid()) + ".safetensors";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  auto file = SafetensorsFile::Open(path);
  ::unlink(path.c_str());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(), HasSubstr(path));
  EXPECT_THAT(file.status().message(), HasSubstr("belong to no tensor"));
}

TEST(SafetensorsTest, EveryTruncationIsAnErrorNotACrash) {
  std::vector<uint8_t> bytes = SerializeSafetensors(SampleTensors(), {{"k", "v"}});
  ASSERT_TRUE(ParseSafetensorsHeader(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    EXPECT_FALSE(ParseSafetensorsHeader(cut).ok()) << n;
  }
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {  // random byte flips: any result but a crash
    std::vector<uint8_t> flipped = bytes;
    flipped[rng() % flipped.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    auto file = SafetensorsFile::FromBytes(flipped);
    if (file.ok()) {
      for (const auto& [name, info] : (*file)->header().tensors) {
        (void)(*file)->ReadF32(name, info.shape);
      }
    }
  }
}

TEST(SafetensorsTest, OpenReportsMissingFileAndNonFile) {
  auto missing = SafetensorsFile::Open(TempPath("does-not-exist"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("does-not-exist"));
  auto dir = SafetensorsFile::Open(testing::TempDir());
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));
}

ModelConfig TinyConfig() {
  ModelConfig c;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 48;
  return c;
}

TEST(ModelConfigTest, MetadataAndJsonRoundTrip) {
  ModelConfig c = TinyConfig();
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-6;
  EXPECT_EQ(*ModelConfig::FromMetadata(c.ToMetadata()), c);
  EXPECT_EQ(*ModelConfig::FromJson(c.ToJson()), c);
  Metadata m = c.ToMetadata();
  m.erase("num_key_value_heads");
  EXPECT_THAT(ModelConfig::FromMetadata(m).status().message(),
              HasSubstr("'num_key_value_heads' is missing"));
  m = c.ToMetadata();
  m["hidden_size"] = "3x";
  EXPECT_THAT(ModelConfig::FromMetadata(m).status().message(), HasSubstr("'hidden_size' = '3x'"));
  c.num_key_value_heads = 3;
  EXPECT_THAT(c.Validate().message(), HasSubstr("'num_key_value_heads' 3"));
  EXPECT_EQ(StageLayers(8, 3, 4).begin, 6);
  EXPECT_EQ(StageLayers(7, 2, 3).end, 7);
}

// A checkpoint whose tensor `name` is replaced by `replacement` (or removed when null).
std::string ModelWith(const std::string& name, const Tensor* replacement,
                      const Metadata& metadata) {
  TensorDict tensors = RandomModelTensors(TinyConfig(), 3, DType::kF32);
  tensors.Erase(name);
  if (replacement != nullptr) tensors.Set(name, *replacement);
  std::string path = TempPath("bad-model.safetensors");
  EXPECT_TRUE(WriteSafetensors(path, tensors, metadata).ok());
  return path;
}

TEST(SafetensorsTest, MismatchedCheckpointsNameTheTensorOrField) {
  Metadata meta = TinyConfig().ToMetadata();
  std::string path = ModelWith("model.layers.1.mlp.up_proj.weight", nullptr, meta);
  auto engine = StageEngine::Load(path, StageAt(1, 2));
  EXPECT_THAT(engine.status().message(),
              HasSubstr("tensor 'model.layers.1.mlp.up_proj.weight' is missing"));
  // Stage 0 does not need layer 1: it loads.
  EXPECT_TRUE(StageEngine::Load(path, StageAt(0, 2)).ok());

  Tensor wrong = Tensor::Zeros<float>({48, 31});
  path = ModelWith("model.layers.0.mlp.gate_proj.weight", &wrong, meta);
  EXPECT_THAT(
      StageEngine::Load(path, StageAt(0, 1)).status().message(),
      HasSubstr("'model.layers.0.mlp.gate_proj.weight' has shape [48, 31], expected [48, 32]"));

  Tensor ints = Tensor::Zeros<int32_t>({32});
  path = ModelWith("model.norm.weight", &ints, meta);
  EXPECT_THAT(StageEngine::Load(path, StageAt(0, 1)).status().message(),
              HasSubstr("'model.norm.weight' has dtype I32"));

  Metadata no_heads = meta;
  no_heads.erase("num_attention_heads");
  path = ModelWith("lm_head.weight", nullptr, no_heads);
  EXPECT_THAT(StageEngine::Load(path, StageAt(0, 1)).status().message(),
              HasSubstr("'num_attention_heads' is missing"));

  path = ModelWith("lm_head.weight", nullptr, meta);
  EXPECT_THAT(StageEngine::Load(path, StageAt(0, 3)).status().message(),
              HasSubstr("cannot split 2 layers into 3 stages"));
  ::unlink(path.c_str());
}

TEST(SafetensorsTest, ConfigJsonBesideTheFile) {
  std::string dir = TempPath("hf-dir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors",
                               RandomModelTensors(TinyConfig(), 3, DType::kBF16), {})
                  .ok());
  EXPECT_THAT(ReadModelConfig(dir).status().message(), HasSubstr("config.json"));
  std::ofstream(dir + "/config.json") << TinyConfig().ToJson();
  auto config = ReadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, TinyConfig());
  EXPECT_TRUE(StageEngine::Load(dir, StageAt(0, 1)).ok());
  ::unlink((dir + "/model.safetensors").c_str());
  ::unlink((dir + "/config.json").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace connex::engine
