#include "connex/pp/replay_cache.h"

#include "connex/pp/internal/recent_set.h"
#include "connex/pp/request_scope.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

TensorDict Bytes(size_t n) {
  TensorDict d;
  d.Set("x", Tensor::Of<int32_t>({static_cast<int64_t>(n / 4)}, std::vector<int32_t>(n / 4, 1)));
  return d;
}

StepKey Key(uint64_t step) { return StepKey{Lid{"m", 0, 0, 0}, 9, step}; }

// Issue 9 finding 4: the cache kept 2048 whole outputs, whatever their size.
TEST(ReplayCacheTest, IsBoundedInBytesAndEntries) {
  ReplayCache cache(/*max_entries=*/100, /*max_bytes=*/10'000);
  for (uint64_t s = 1; s <= 50; ++s) cache.Put(Key(s), Bytes(1000));
  EXPECT_LE(cache.bytes(), 10'000u);
  EXPECT_LT(cache.size(), 10u);
  EXPECT_NE(cache.Find(Key(50)), nullptr);  // the newest stay
  EXPECT_EQ(cache.Find(Key(1)), nullptr);   // the oldest went first
  ReplayCache few(3, 1 << 20);
  for (uint64_t s = 1; s <= 10; ++s) few.Put(Key(s), Bytes(8));
  EXPECT_EQ(few.size(), 3u);
  EXPECT_NE(few.Find(Key(8)), nullptr);
}

TEST(ReplayCacheTest, AnOutputLargerThanTheBoundIsNotKept) {
  ReplayCache cache(10, 1000);
  cache.Put(Key(1), Bytes(4000));
  EXPECT_EQ(cache.Find(Key(1)), nullptr);
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST(ReplayCacheTest, ReplacingAnEntryKeepsTheCountRight) {
  ReplayCache cache(2, 1 << 20);
  for (int i = 0; i < 100; ++i) cache.Put(Key(1), Bytes(8));
  cache.Put(Key(2), Bytes(8));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.Find(Key(1)), nullptr);
}

// Issue 9 finding 2: stages keyed a request by its id alone, so a restarted owner's request 1
// met the state (and the last step id) of its predecessor's request 1.
TEST(RequestScopeTest, AnotherOwnerIncarnationNeverSharesARequest) {
  RequestScope scope;
  OwnerKey old_owner{Lid{"m", 0, 0, 0}, 111};
  OwnerKey new_owner{Lid{"m", 0, 0, 0}, 222};
  RequestScope::Entry& a = scope.FindOrCreate(old_owner, 5, 1);
  a.last_step = 900;
  EXPECT_EQ(scope.Find(new_owner, 1), nullptr);
  RequestScope::Entry& b = scope.FindOrCreate(new_owner, 6, 1);
  EXPECT_NE(a.local_id, b.local_id);
  EXPECT_EQ(b.last_step, 0u);
  EXPECT_EQ(scope.requests(), 2u);
}

TEST(RequestScopeTest, DropsEveryRequestOfAGoneOwnerIncarnation) {
  RequestScope scope;
  OwnerKey owner{Lid{"m", 0, 0, 0}, 111};
  OwnerKey other{Lid{"m", 0, 0, 1}, 333};
  uint64_t l1 = scope.FindOrCreate(owner, 5, 1).local_id;
  uint64_t l2 = scope.FindOrCreate(owner, 5, 2).local_id;
  scope.FindOrCreate(other, 7, 1);
  EXPECT_TRUE(scope.EraseOwner(owner.lid, 4).empty());  // another epoch: not this one
  std::vector<uint64_t> gone = scope.EraseOwner(owner.lid, 5);
  EXPECT_EQ(gone, (std::vector<uint64_t>{l1, l2}));
  EXPECT_EQ(scope.requests(), 1u);
  EXPECT_FALSE(scope.Knows(owner));
  EXPECT_TRUE(scope.Knows(other));
  EXPECT_EQ(scope.Erase(other, 1).has_value(), true);
  EXPECT_EQ(scope.owners(), 0u);
}

TEST(RecentSetTest, ForgetsTheOldestBeyondItsCapacity) {
  internal::RecentSet<int> set(3);
  EXPECT_TRUE(set.Insert(1));
  EXPECT_FALSE(set.Insert(1));
  set.Insert(2);
  set.Insert(3);
  set.Insert(4);
  EXPECT_FALSE(set.Contains(1));
  EXPECT_TRUE(set.Contains(4));
  EXPECT_EQ(set.size(), 3u);
}

}  // namespace
}  // namespace connex::pp
