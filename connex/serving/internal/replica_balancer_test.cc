#include "connex/serving/internal/replica_balancer.h"

#include "gtest/gtest.h"

namespace connex::serving::internal {
namespace {

using Clock = ReplicaBalancer::Clock;
using std::chrono::milliseconds;

const Replica kA{"m/g0/s0/r0@1", "127.0.0.1:1"};
const Replica kB{"m/g0/s0/r1@2", "127.0.0.1:2"};

TEST(ReplicaBalancerTest, PicksTheLeastBusyReplica) {
  ReplicaBalancer b;
  const Clock::time_point now = Clock::now();
  b.Started(kA.name);
  EXPECT_EQ(b.Pick({kA, kB}, "", now), kB);
  b.Started(kB.name);
  b.Started(kB.name);
  EXPECT_EQ(b.Pick({kA, kB}, "", now), kA);
  b.Ended(kB.name);
  b.Ended(kB.name);
  EXPECT_EQ(b.inflight(kB.name), 0);
}

TEST(ReplicaBalancerTest, AvoidsTheReplicaThatFailedLastWhileAnotherIsUp) {
  ReplicaBalancer b;
  const Clock::time_point now = Clock::now();
  b.Started(kB.name);  // busier, but not the one to avoid
  EXPECT_EQ(b.Pick({kA, kB}, kA.name, now), kB);
  // The only one there is: avoided or not, it is picked.
  EXPECT_EQ(b.Pick({kA}, kA.name, now), kA);
}

TEST(ReplicaBalancerTest, AFailedReplicaRestsASecondAndOneThatRefusesLongerEachTime) {
  ReplicaBalancer b;
  const Clock::time_point t0 = Clock::now();
  b.Failed(kA.name, /*connect=*/true, t0);
  EXPECT_EQ(b.Pick({kA}, "", t0 + milliseconds(999)), std::nullopt);
  EXPECT_EQ(b.NextUp({kA}), t0 + milliseconds(kReplicaDownMs));
  EXPECT_EQ(b.Pick({kA}, "", t0 + milliseconds(kReplicaDownMs)), kA);
  b.Connected(kA.name);
  // Refused connections in a row: 1 s, 2 s, 4 s, then 4 s (the cap).
  Clock::time_point t = t0 + milliseconds(10'000);
  for (int64_t want : {1'000, 2'000, 4'000, 4'000}) {
    b.Failed(kA.name, /*connect=*/true, t);
    EXPECT_EQ(b.NextUp({kA}), t + milliseconds(want));
    t += milliseconds(want);
  }
  // A connection that gets through ends the series.
  b.Connected(kA.name);
  b.Failed(kA.name, /*connect=*/true, t);
  EXPECT_EQ(b.NextUp({kA}), t + milliseconds(kReplicaDownMs));
}

// Found with a host cut off (multihost_test): it held stage 1 of chain 0 and stage 0 of chain
// 1, so the streams of both stage 0s fell silent at once; chain 0's stage 0 re-routed within a
// second, but with both replicas resting every resumed request waited the whole second more.
TEST(ReplicaBalancerTest, AReplicaWhoseStreamBrokeIsPickedWhenNoneIsUp) {
  ReplicaBalancer b;
  const Clock::time_point t0 = Clock::now();
  b.Failed(kA.name, /*connect=*/false, t0);
  b.Failed(kB.name, /*connect=*/false, t0);
  EXPECT_EQ(b.Pick({kA, kB}, kB.name, t0), kA);  // none is up: the one not to avoid
  EXPECT_FALSE(b.Up(kA.name, t0));
  // One that could not be connected to rests whatever happens: the other is picked...
  b.Failed(kA.name, /*connect=*/true, t0);
  EXPECT_EQ(b.Pick({kA, kB}, kB.name, t0), kB);
  // ...and with only it left, none.
  EXPECT_EQ(b.Pick({kA}, "", t0), std::nullopt);
  // While a replica is up, one resting after a broken stream is not picked, however idle.
  ReplicaBalancer c;
  c.Failed(kA.name, /*connect=*/false, t0);
  c.Started(kB.name);
  c.Started(kB.name);
  EXPECT_EQ(c.Pick({kA, kB}, "", t0), kB);
}

TEST(ReplicaBalancerTest, ForgetsAReplicaThatLeftOnceNothingIsInFlightThere) {
  ReplicaBalancer b;
  const Clock::time_point now = Clock::now();
  b.Started(kA.name);
  b.Failed(kA.name, /*connect=*/true, now);
  EXPECT_EQ(b.Pick({kB}, "", now), kB);  // kA left the directory, an attempt still runs there
  EXPECT_EQ(b.inflight(kA.name), 1);
  b.Ended(kA.name);
  EXPECT_EQ(b.Pick({kB}, "", now), kB);
  EXPECT_EQ(b.NextUp({kA}), std::nullopt);  // forgotten: a clean slate if it is listed again
  EXPECT_TRUE(b.Up(kA.name, now));
}

}  // namespace
}  // namespace connex::serving::internal
