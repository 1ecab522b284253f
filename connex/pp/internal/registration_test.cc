#include "connex/pp/internal/registration.h"

#include "connex/directory/client.h"
#include "connex/directory/protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp::internal {
namespace {

using ::testing::HasSubstr;

const Lid kSelf{"m", 1, 0, 0};
const Lid kOther{"m", 1, 0, 1};

directory::Event EventOf(directory::EventKind kind, const Lid& lid, uint64_t epoch) {
  directory::Event e;
  e.kind = kind;
  e.record.lid = lid;
  e.record.epoch = epoch;
  e.reason = "reported";
  return e;
}

TEST(RegistrationTest, ARejoinAdvancesTheEpochAndALostRegistrationSaysWhy) {
  Registration reg;
  reg.AdvanceEpoch(4);
  reg.OnChange(kSelf, directory::RegistrationChange{kSelf, 4, 6, absl::OkStatus(), false});
  EXPECT_EQ(reg.epoch.load(), 6u);
  reg.OnChange(kSelf, directory::RegistrationChange{kOther, 6, 9, absl::OkStatus(), false});
  EXPECT_EQ(reg.epoch.load(), 6u);  // another LID's
  reg.OnChange(kSelf, directory::RegistrationChange{
                          kSelf, 6, 0, absl::FailedPreconditionError("superseded"), false});
  connex::MutexLock lock(&reg.mu);
  EXPECT_EQ(reg.lost.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reg.lost.message(), HasSubstr("m/g1/s0/r0 lost its LID (epoch 6)"));
  EXPECT_FALSE(reg.ended_by_leave.load());
}

TEST(RegistrationTest, AnEpochEndedByALeaveIsNoted) {
  Registration reg;
  reg.AdvanceEpoch(4);
  reg.OnChange(kSelf, directory::RegistrationChange{
                          kSelf, 4, 0, absl::FailedPreconditionError("it left"), true});
  EXPECT_TRUE(reg.ended_by_leave.load());
}

TEST(RegistrationTest, AFailedOfTheEpochHeldRevokesItAndOnlyThatOne) {
  Registration reg;
  reg.AdvanceEpoch(4);
  reg.OnEvent(kSelf, EventOf(directory::EventKind::kFailed, kSelf, 3));  // an older epoch
  reg.OnEvent(kSelf, EventOf(directory::EventKind::kFailed, kOther, 4));
  EXPECT_EQ(reg.revoked.load(), 0u);
  reg.OnEvent(kSelf, EventOf(directory::EventKind::kFailed, kSelf, 4));
  EXPECT_EQ(reg.revoked.load(), 4u);
  EXPECT_EQ(reg.RevokedWhy(), "FAILED (reported)");
  EXPECT_FALSE(reg.operator_drain.load());
}

TEST(RegistrationTest, ALeftOfTheEpochHeldIsAnOperatorsDrainUnlessItWasOurLeave) {
  Registration reg;
  reg.AdvanceEpoch(4);
  reg.OnEvent(kSelf, EventOf(directory::EventKind::kLeft, kSelf, 3));
  EXPECT_FALSE(reg.operator_drain.load());
  reg.leaving.store(true);
  reg.OnEvent(kSelf, EventOf(directory::EventKind::kLeft, kSelf, 4));
  EXPECT_FALSE(reg.operator_drain.load());
  reg.leaving.store(false);
  reg.OnEvent(kSelf, EventOf(directory::EventKind::kLeft, kSelf, 4));
  EXPECT_TRUE(reg.operator_drain.load());
  EXPECT_EQ(reg.revoked.load(), 0u);  // a drain is no fence
}

}  // namespace
}  // namespace connex::pp::internal
