#include "connex/base/status.h"

#include "absl/strings/cord.h"
#include "gtest/gtest.h"

namespace connex {
namespace {

TEST(AnnotateTest, PrefixesTheMessageAndKeepsTheCodeAndThePayloads) {
  absl::Status s = absl::FailedPreconditionError("epoch 3 has left");
  s.SetPayload("type.test/detail", absl::Cord("x"));
  absl::Status a = Annotate(s, "directory: HEARTBEAT");
  EXPECT_EQ(a.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.message(), "directory: HEARTBEAT: epoch 3 has left");
  ASSERT_TRUE(a.GetPayload("type.test/detail").has_value());
  EXPECT_EQ(std::string(*a.GetPayload("type.test/detail")), "x");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

}  // namespace
}  // namespace connex
