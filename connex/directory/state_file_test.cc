#include "connex/directory/state_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory {
namespace {

using ::testing::HasSubstr;

class StateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/state-file-" + std::to_string(getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(StateFileTest, SavesAndLoadsAndLocksTheDirectory) {
  auto file = StateFile::Open(dir_);
  ASSERT_TRUE(file.ok()) << file.status();
  auto empty = (*file)->Load();
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->has_value());
  RegistryState state;
  state.next_epoch = 4242;
  state.revision = 17;
  RegistryState::Entry e;
  e.record.lid = Lid{"demo", 1, 0, 2};
  e.record.epoch = 4241;
  e.record.addresses = {"tcp://h:1", "shm://x"};
  e.record.metadata = {{"stage", "1"}};
  e.credential = "c1";
  e.previous_epoch = 4000;
  e.previous_credential = "c0";
  state.entries.push_back(e);
  ASSERT_TRUE((*file)->Save(state).ok());
  struct stat st;
  ASSERT_EQ(stat((*file)->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);  // it holds credentials
  // A second directory on the same state dir is refused while the first runs.
  auto second = StateFile::Open(dir_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
  file->reset();
  auto again = StateFile::Open(dir_);
  ASSERT_TRUE(again.ok());
  auto loaded = (*again)->Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->next_epoch, 4242u);
  EXPECT_EQ((*loaded)->revision, 17u);
  ASSERT_EQ((*loaded)->entries.size(), 1u);
  const RegistryState::Entry& got = (*loaded)->entries[0];
  EXPECT_EQ(got.record, e.record);
  EXPECT_EQ(got.credential, "c1");
  EXPECT_EQ(got.previous_epoch, 4000u);
  EXPECT_EQ(got.previous_credential, "c0");
}

TEST_F(StateFileTest, ACorruptFileIsDataLoss) {
  auto file = StateFile::Open(dir_);
  ASSERT_TRUE(file.ok());
  {
    std::ofstream out((*file)->path());
    out << "garbage";
  }
  auto loaded = (*file)->Load();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("epochs could repeat"));
}

}  // namespace
}  // namespace connex::directory
