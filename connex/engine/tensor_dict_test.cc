#include "connex/engine/tensor_dict.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::engine {
namespace {

using ::testing::HasSubstr;

TEST(TensorDictTest, DTypeNamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    EXPECT_EQ(ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(ParseDType("F64"), std::nullopt);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
}

TEST(TensorDictTest, NumElementsRejectsOverflowAndNegative) {
  std::vector<int64_t> ok = {2, 3, 4}, empty = {}, neg = {2, -1}, big = {1ll << 40, 1ll << 40};
  EXPECT_EQ(NumElements(ok), 24);
  EXPECT_EQ(NumElements(empty), 1);
  EXPECT_EQ(NumElements(neg), std::nullopt);
  EXPECT_EQ(NumElements(big), std::nullopt);
}

TEST(TensorDictTest, GetChecksDTypeRankAndSize) {
  TensorDict dict;
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  dict.Set("x", Tensor::Of<float>({2, 3}, values));
  ASSERT_TRUE(dict.Get("x", DType::kF32, 2).ok());
  EXPECT_EQ((*dict.Get("x", DType::kF32))->values<float>()[5], 6.0f);
  EXPECT_THAT(dict.Get("y", DType::kF32).status().message(), HasSubstr("'y' is missing"));
  EXPECT_THAT(dict.Get("x", DType::kI32).status().message(), HasSubstr("dtype F32, expected I32"));
  EXPECT_THAT(dict.Get("x", DType::kF32, 1).status().message(), HasSubstr("expected rank 1"));
  Tensor bad = dict.tensors().at("x");
  bad.shape = {4, 3};
  dict.Set("bad", bad);
  EXPECT_THAT(dict.Get("bad", DType::kF32).status().message(), HasSubstr("does not match"));
  dict.Erase("bad");
  EXPECT_FALSE(dict.Contains("bad"));
}

}  // namespace
}  // namespace connex::engine
