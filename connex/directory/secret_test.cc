#include "connex/directory/secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory {
namespace {

using ::testing::HasSubstr;

TEST(SecretTest, CredentialsAreLongAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string c = NewCredential();
    ASSERT_EQ(c.size(), 32u);
    ASSERT_EQ(c.find_first_not_of("0123456789abcdef"), std::string::npos);
    ASSERT_TRUE(seen.insert(c).second);
  }
}

TEST(SecretTest, EmptySecretsEqualNothing) {
  EXPECT_TRUE(SecretsEqual("abc", "abc"));
  EXPECT_FALSE(SecretsEqual("abc", "abd"));
  EXPECT_FALSE(SecretsEqual("abc", "abcd"));
  EXPECT_FALSE(SecretsEqual("", ""));
}

TEST(SecretTest, SecretFilesMustBePrivateAndNonEmpty) {
  std::string path = ::testing::TempDir() + "/secret-" + std::to_string(getpid());
  {
    std::ofstream out(path);
    out << "  s3cret \nsecond line\n";
  }
  chmod(path.c_str(), 0644);
  absl::StatusOr<std::string> open = ReadSecretFile(path);
  EXPECT_THAT(std::string(open.status().message()), HasSubstr("may be read by others"));
  chmod(path.c_str(), 0600);
  EXPECT_EQ(*ReadSecretFile(path), "s3cret");
  { std::ofstream out(path); }
  EXPECT_THAT(std::string(ReadSecretFile(path).status().message()), HasSubstr("is empty"));
  unlink(path.c_str());
  EXPECT_EQ(ReadSecretFile(path).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace connex::directory
