#include "connex/pp/epoch_ledger.h"

#include "gtest/gtest.h"

namespace connex::pp {
namespace {

TEST(EpochLedgerTest, CountsStepsAndTheLastAdmissionPerEpoch) {
  EpochLedger l;
  l.Hold(5);
  l.Executed(5, 100);
  l.Executed(5, 300);
  l.Executed(5, 200);  // admitted earlier, finished later: the latest admission stays
  l.Hold(7);
  ASSERT_EQ(l.epochs().size(), 2u);
  EXPECT_EQ(l.epochs()[0].epoch, 5u);
  EXPECT_EQ(l.epochs()[0].steps_executed, 3u);
  EXPECT_EQ(l.epochs()[0].last_step_monotonic_ns, 300);
  EXPECT_EQ(l.epochs()[1].epoch, 7u);
  EXPECT_EQ(l.epochs()[1].steps_executed, 0u);
  EXPECT_EQ(l.epochs()[1].last_step_monotonic_ns, 0);
  l.Executed(0, 400);  // no epoch: not recorded
  EXPECT_EQ(l.epochs().size(), 2u);
}

TEST(EpochLedgerTest, KeepsTheNewestEpochsOnly) {
  EpochLedger l;
  for (uint64_t e = 1; e <= EpochLedger::kEpochsKept + 3; ++e) l.Executed(e, 10);
  ASSERT_EQ(l.epochs().size(), EpochLedger::kEpochsKept);
  EXPECT_EQ(l.epochs().front().epoch, 4u);
  EXPECT_EQ(l.epochs().back().epoch, EpochLedger::kEpochsKept + 3);
  l.Executed(2, 20);  // older than every epoch kept: forgotten
  EXPECT_EQ(l.epochs().front().epoch, 4u);
}

TEST(EpochLedgerTest, MonotonicClockMoves) {
  int64_t a = MonotonicNowNs();
  EXPECT_GT(a, 0);
  EXPECT_GE(MonotonicNowNs(), a);
}

}  // namespace
}  // namespace connex::pp
