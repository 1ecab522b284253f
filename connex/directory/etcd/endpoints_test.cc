#include "connex/directory/etcd/endpoints.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

using ::testing::HasSubstr;

TEST(EtcdEndpointsTest, ParsesEveryMemberInOrder) {
  auto members = ParseEtcdAddress("etcd://10.0.0.1:2379,etcd-b.example:2380,[::1]:23790");
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 3u);
  EXPECT_EQ((*members)[0], (EtcdEndpoint{"10.0.0.1", 2379}));
  EXPECT_EQ((*members)[1], (EtcdEndpoint{"etcd-b.example", 2380}));
  EXPECT_EQ((*members)[2], (EtcdEndpoint{"::1", 23790}));
  EXPECT_EQ((*members)[2].ToString(), "[::1]:23790");
  EXPECT_EQ((*members)[0].ToString(), "10.0.0.1:2379");
}

TEST(EtcdEndpointsTest, TellsEtcdAddressesApart) {
  EXPECT_TRUE(IsEtcdAddress("etcd://h:1"));
  EXPECT_FALSE(IsEtcdAddress("tcp://127.0.0.1:7000"));
}

TEST(EtcdEndpointsTest, RefusesBadAddressesSayingWhatIsWrong) {
  struct Case {
    const char* address;
    const char* why;
  };
  const Case cases[] = {
      {"tcp://h:2379", "does not start with etcd://"},
      {"etcd://", "no member is listed"},
      {"etcd://h:2379,", "an empty member"},
      {"etcd://h:2379,,k:1", "an empty member"},
      {"etcd://h", "member 'h' has no :PORT"},
      {"etcd://:2379", "has no host"},
      {"etcd://h:0", "port '0' is not 1-65535"},
      {"etcd://h:65536", "port '65536' is not 1-65535"},
      {"etcd://h:23x", "port '23x' is not 1-65535"},
      {"etcd://h:", "port '' is not 1-65535"},
      {"etcd://h:2379/v3", "port '2379/v3' is not 1-65535"},
      {"etcd://http://h:2379", "is not a name or an IPv4 address"},
      {"etcd://[::1:2379", "'[' without ']'"},
      {"etcd://[::1]2379", "has no :PORT"},
      {"etcd://[zz]:2379", "not an IPv6 address"},
      {"etcd://h:2379,h:2379", "member 'h:2379' is listed twice"},
  };
  for (const Case& c : cases) {
    auto members = ParseEtcdAddress(c.address);
    ASSERT_FALSE(members.ok()) << c.address;
    EXPECT_EQ(members.status().code(), absl::StatusCode::kInvalidArgument) << c.address;
    EXPECT_THAT(std::string(members.status().message()), HasSubstr(c.why)) << c.address;
    EXPECT_THAT(std::string(members.status().message()), HasSubstr(c.address)) << c.address;
  }
}

}  // namespace
}  // namespace connex::directory::etcd
