#include "connex/transport/internal/region_table.h"

#include <atomic>
#include <thread>

#include "connex/base/wait.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::transport::internal {
namespace {

using ::testing::HasSubstr;

TEST(RegionTableTest, RegisterAcquireUnregister) {
  RegionTable t;
  ASSERT_TRUE(t.Register({0x1000, 0x100}).ok());
  ASSERT_TRUE(t.Register({0x1100, 0x100}).ok());  // adjacent is fine
  EXPECT_EQ(t.Register({0x10ff, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Register({0x0fff, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Register({0, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.Acquire(0x1000, 0x100, "x").ok());
  EXPECT_TRUE(t.Acquire(0x10ff, 1, "x").ok());
  absl::Status s = t.Acquire(0x10ff, 2, "remote").status();  // spans two regions
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("remote range [0x10ff, +2) is not registered"));
  EXPECT_FALSE(t.Acquire(0xfff, 1, "x").ok());
  EXPECT_FALSE(t.Acquire(0x1000, UINT64_MAX, "x").ok());  // wraps
  EXPECT_TRUE(t.Unregister(0x1000).ok());
  EXPECT_FALSE(t.Unregister(0x1000).ok());
  EXPECT_FALSE(t.Acquire(0x1000, 1, "x").ok());
}

TEST(RegionTableTest, UnregisterWaitsForPins) {
  RegionTable t;
  ASSERT_TRUE(t.Register({0x1000, 0x100}).ok());
  auto pin = std::make_unique<RegionTable::Pin>(t.Acquire(0x1000, 1, "x").value());
  std::atomic<bool> done{false}, released{false};
  std::thread th([&] {
    EXPECT_TRUE(t.Unregister(0x1000).ok());
    EXPECT_TRUE(released.load()) << "Unregister returned while a pin was held";
    done = true;
  });
  // Unregister has begun once the region takes no new pins (a pin taken before that is released
  // at once); from then on it must wait for `pin`.
  ASSERT_TRUE(WaitUntil([&] { return !t.Acquire(0x1000, 1, "x").ok(); }, 10000));
  EXPECT_FALSE(done.load());
  released = true;
  pin.reset();
  th.join();
  EXPECT_TRUE(done.load());
}

}  // namespace
}  // namespace connex::transport::internal
