// The watched view's delivery: events held back by the delay hook reach subscribers and the
// epoch-ended callback in order once due, and after StopDelivery nothing is delivered any more
// (the owner then destroys what the callbacks reach: a client's lease keeper).
#include "connex/directory/internal/watched_view.h"

#include <atomic>

#include "connex/base/clock.h"
#include "connex/base/wait.h"
#include "gtest/gtest.h"

namespace connex::directory::internal {
namespace {

Event FailedEvent(uint64_t revision) {
  Event e;
  e.revision = revision;
  e.kind = EventKind::kFailed;
  e.record.lid = *Lid::Parse("m/g0/s0/r0");
  e.record.epoch = 7;
  e.reason = "lease-expired";
  return e;
}

TEST(WatchedViewTest, HeldBackEventsAreDeliveredInOrderOnceDue) {
  FakeClock clock;
  WatchedView view(&clock);
  std::atomic<int> ended{0};
  std::atomic<uint64_t> last{0};
  view.OnEpochEnded([&](const Event&) { ++ended; });
  view.Subscribe([&](const Event& e) {
    EXPECT_GT(e.revision, last.load());
    last = e.revision;
  });
  view.DelayEventsForTest(1'000);
  view.OnEvent(FailedEvent(1));
  view.OnEvent(FailedEvent(2));
  EXPECT_EQ(ended.load(), 0);  // not due: the fake clock has not moved
  clock.AdvanceMs(1'000);
  EXPECT_TRUE(WaitUntil([&] { return last.load() == 2; }, 10'000));
  EXPECT_EQ(ended.load(), 2);
}

TEST(WatchedViewTest, AfterStopDeliveryNothingIsDelivered) {
  FakeClock clock;
  WatchedView view(&clock);
  std::atomic<int> calls{0};
  view.OnEpochEnded([&](const Event&) { ++calls; });
  view.Subscribe([&](const Event&) { ++calls; });
  Snapshot snapshot;
  snapshot.revision = 1;
  snapshot.records = {FailedEvent(0).record};
  view.OnSnapshot("", snapshot);  // the view's starting point: m/g0/s0/r0, epoch 7
  view.DelayEventsForTest(1'000);
  view.OnEvent(FailedEvent(2));  // held back
  view.StopDelivery();           // joins the delay thread: none can run after this
  clock.AdvanceMs(10'000);
  view.OnEvent(FailedEvent(3));  // arrives after the stop
  EXPECT_EQ(calls.load(), 0);
  // The view itself followed the events (it is never delayed): only delivery stopped.
  EXPECT_TRUE(view.AwaitView(
      "m", [](const std::vector<Record>& records) { return records.empty(); }, 0));
}

}  // namespace
}  // namespace connex::directory::internal
