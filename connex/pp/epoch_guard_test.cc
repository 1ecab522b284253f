#include "connex/pp/epoch_guard.h"

#include <optional>

#include "connex/base/clock.h"
#include "connex/directory/held_lease.h"
#include "connex/pp/internal/registration.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::HasSubstr;

// A directory lease under the test's control: renewed at `renewed_ms`, a TTL, and what a
// confirmation (Renew) answers; the client's handle of it (`held`) learns a newer epoch of ours
// from a confirmation, as the directory client's does.
class FakeLease final : public LeaseSource {
 public:
  FakeLease(const FakeClock* clock, directory::HeldLease* held)
      : clock_(clock), held_(held), renewed_ms_(clock->NowMs()) {}
  std::optional<int64_t> RenewalAgeMs() const override { return clock_->NowMs() - renewed_ms_; }
  std::optional<int64_t> LeaseLeftMs() const override {
    return ttl_ms_ - (clock_->NowMs() - renewed_ms_);
  }
  int64_t heartbeat_ms() const override { return 500; }
  absl::StatusOr<uint64_t> Renew() override {
    ++renews_;
    if (answer_.ok()) {
      renewed_ms_ = clock_->NowMs();
      held_->Advance(*answer_, /*fresh=*/false);
    }
    return answer_;
  }

  void Renewed() { renewed_ms_ = clock_->NowMs(); }
  void Answer(absl::StatusOr<uint64_t> answer) { answer_ = std::move(answer); }
  int renews() const { return renews_; }

 private:
  const FakeClock* clock_;
  directory::HeldLease* held_;
  int64_t renewed_ms_;
  int64_t ttl_ms_ = 6000;
  absl::StatusOr<uint64_t> answer_ = absl::UnavailableError("the directory does not answer");
  int renews_ = 0;
};

class EpochGuardTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kEpoch = 7;
  static constexpr int64_t kStallMs = 1000;

  EpochGuardTest()
      : held_(std::make_shared<directory::HeldLease>(Lid{"pp", 1, 0, 0})),
        reg_(held_),
        lease_(&clock_, held_.get()),
        guard_("pp/g1/s0/r0", &clock_, kStallMs, &reg_, &lease_) {
    held_->Advance(kEpoch, /*fresh=*/true);
  }

  // The loop runs for `ms` with a sign of life every 100 ms, hearing from a peer if `peers`.
  void Run(int64_t ms, bool peers) {
    for (int64_t t = 0; t < ms; t += 100) {
      clock_.AdvanceMs(100);
      guard_.NoteAlive();
      if (peers) guard_.NotePeer();
    }
  }

  FakeClock clock_;
  std::shared_ptr<directory::HeldLease> held_;
  internal::Registration reg_;
  FakeLease lease_;
  EpochGuard guard_;
};

TEST_F(EpochGuardTest, AHealthyStageIsAdmittedWithoutAskingTheDirectory) {
  for (int i = 0; i < 10; ++i) {
    Run(400, /*peers=*/true);
    lease_.Renewed();
    EXPECT_TRUE(guard_.Admit(kEpoch).ok());
  }
  EXPECT_EQ(lease_.renews(), 0);
  EXPECT_EQ(guard_.stats().steps_on_lease, 0u);
}

TEST_F(EpochGuardTest, AnEvictedEpochIsRefused) {
  held_->Evict(kEpoch, "FAILED (reported)");
  absl::Status admitted = guard_.Admit(kEpoch);
  EXPECT_EQ(admitted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(admitted.message(), HasSubstr("FAILED (reported)"));
}

// The directory down: no renewal for 3 s, the peers answer throughout; steps run on the lease
// (its TTL is 6 s) without a single confirmation, until the lease could have run out.
TEST_F(EpochGuardTest, StepsRunOnTheLeaseWhileTheDirectoryIsDownAndThePeersAnswer) {
  for (int i = 0; i < 30; ++i) {
    Run(100, /*peers=*/true);
    EXPECT_TRUE(guard_.Admit(kEpoch).ok()) << "at " << (i + 1) * 100 << " ms";
  }
  EXPECT_EQ(lease_.renews(), 0);
  EXPECT_GT(guard_.stats().steps_on_lease, 10u);
  // 6 s TTL, a stall bound of margin: past 5 s without a renewal the epoch is confirmed first,
  // and with the directory still down the step is refused (Unavailable), not run.
  Run(2100, /*peers=*/true);
  absl::Status late = guard_.Admit(kEpoch);
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  EXPECT_EQ(lease_.renews(), 1);
  // Asked again only a stall bound later.
  EXPECT_EQ(guard_.Admit(kEpoch).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lease_.renews(), 1);
  // Back: the confirmation finds the epoch current.
  lease_.Answer(kEpoch);
  Run(kStallMs, /*peers=*/true);
  EXPECT_TRUE(guard_.Admit(kEpoch).ok());
  EXPECT_EQ(lease_.renews(), 2);
}

// A partition: neither the directory nor the peers heard from for 3 s; the step that arrives
// when the link is back is admitted only after the directory confirms the epoch — here it was
// evicted meanwhile (a peer's report), so it is refused, and so is every later step under it.
TEST_F(EpochGuardTest, AfterASilenceFromThePeersTooTheEpochIsConfirmedFirst) {
  Run(200, /*peers=*/true);
  Run(3000, /*peers=*/false);
  lease_.Answer(absl::FailedPreconditionError("epoch 7 is no longer held"));
  absl::Status admitted = guard_.Admit(kEpoch);
  EXPECT_EQ(admitted.code(), absl::StatusCode::kFailedPrecondition) << admitted;
  EXPECT_EQ(lease_.renews(), 1);
  EXPECT_EQ(guard_.stats().steps_on_lease, 0u);
  // Every later step under it is refused at once.
  guard_.NotePeer();
  EXPECT_EQ(guard_.Admit(kEpoch).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lease_.renews(), 1);
}

// A stage that never heard from a peer (nothing yet to vouch for contact) confirms too.
TEST_F(EpochGuardTest, WithoutAnyPeerHeardFromAnUnrenewedLeaseIsConfirmed) {
  Run(2000, /*peers=*/false);
  lease_.Answer(kEpoch);
  EXPECT_TRUE(guard_.Admit(kEpoch).ok());
  EXPECT_EQ(lease_.renews(), 1);
  EXPECT_EQ(guard_.stats().steps_on_lease, 0u);
}

// The loop frozen longer than the stall bound (SIGSTOP, a long step): the next step is confirmed
// whatever the lease says, and on the lease rule no peer's word replaces that.
TEST_F(EpochGuardTest, AFrozenLoopConfirmsItsEpochBeforeTheNextStep) {
  Run(300, /*peers=*/true);
  clock_.AdvanceMs(2 * kStallMs);  // frozen
  lease_.Renewed();                // the client's heartbeat thread ran on
  guard_.NotePeer();
  lease_.Answer(kEpoch);
  EXPECT_TRUE(guard_.Admit(kEpoch).ok());
  EXPECT_EQ(lease_.renews(), 1);
  EXPECT_EQ(guard_.stats().epoch_checks, 1u);
}

// A confirmation that finds a newer epoch of ours (a rejoin whose reply was lost) refuses the
// step under the old one; the node then runs under the newer one.
TEST_F(EpochGuardTest, AConfirmationThatFindsANewerEpochRefusesTheOldOne) {
  Run(300, /*peers=*/true);
  clock_.AdvanceMs(2 * kStallMs);
  lease_.Answer(kEpoch + 2);
  absl::Status old = guard_.Admit(kEpoch);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.message(), HasSubstr("holds epoch 9 now"));
  EXPECT_EQ(reg_.epoch(), kEpoch + 2);
  EXPECT_TRUE(guard_.Admit(kEpoch + 2).ok());
}

}  // namespace
}  // namespace connex::pp
