#include "connex/serving/listen_address.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

TEST(ParseListenAddressTest, TakesHostAndPort) {
  HttpServerOptions o;
  ASSERT_TRUE(ParseListenAddress("--http", "127.0.0.1:8000", &o).ok());
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 8000);
  ASSERT_TRUE(ParseListenAddress("--http", "0.0.0.0:0", &o).ok());
  EXPECT_EQ(o.port, 0);
}

TEST(ParseListenAddressTest, NamesTheFlagAndTheValueWhenItIsNotHostPort) {
  HttpServerOptions o;
  for (const char* bad : {"8000", ":8000", "host:", "host:80x", "host:65536", "host:-1"}) {
    absl::Status s = ParseListenAddress("--listen", bad, &o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), ::testing::HasSubstr(std::string("--listen ") + bad)) << bad;
  }
}

}  // namespace
}  // namespace connex::serving
