// Subprocess: the environment a child gets (this one's, with the entries given added and
// overriding) and its output read line by line.
#include "connex/base/subprocess.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace connex {
namespace {

TEST(SubprocessTest, TheChildSeesTheGivenEnvironmentTheLaterEntryOfANameWinning) {
  ASSERT_EQ(setenv("CONNEX_SUBPROCESS_TEST_INHERITED", "mine", 1), 0);
  ASSERT_EQ(setenv("CONNEX_SUBPROCESS_TEST_REPLACED", "mine", 1), 0);
  std::optional<Subprocess> p = Subprocess::Start(
      {"/bin/sh", "-c",
       "echo \"$CONNEX_SUBPROCESS_TEST_INHERITED $CONNEX_SUBPROCESS_TEST_REPLACED "
       "$CONNEX_SUBPROCESS_TEST_TWICE\"; env | grep -c '^CONNEX_SUBPROCESS_TEST_TWICE='"},
      {"CONNEX_SUBPROCESS_TEST_REPLACED=given", "CONNEX_SUBPROCESS_TEST_TWICE=first",
       "CONNEX_SUBPROCESS_TEST_TWICE=second"});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->ReadLine(10'000), "mine given second");
  EXPECT_EQ(p->ReadLine(10'000), "1");  // one entry of the name, not two
  EXPECT_EQ(p->Wait(10'000), 0);
  unsetenv("CONNEX_SUBPROCESS_TEST_INHERITED");
  unsetenv("CONNEX_SUBPROCESS_TEST_REPLACED");
}

}  // namespace
}  // namespace connex
