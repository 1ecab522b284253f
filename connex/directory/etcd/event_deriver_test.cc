// EventDeriver (event_deriver.cc) on hand-made watch responses, no etcd: each revision — one
// transaction — becomes the event it means.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/etcd_store.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

WatchEvent Put(const Lid& lid, std::string value, int64_t revision, int64_t version,
               std::optional<KeyValue> prev = std::nullopt) {
  WatchEvent e;
  e.type = WatchEvent::Type::kPut;
  e.kv.key = RecordKey(lid);
  e.kv.value = std::move(value);
  e.kv.mod_revision = revision;
  e.kv.version = version;
  e.prev_kv = std::move(prev);
  return e;
}

WatchEvent Delete(const std::string& key, int64_t revision, std::optional<KeyValue> prev) {
  WatchEvent e;
  e.type = WatchEvent::Type::kDelete;
  e.kv.key = key;
  e.kv.mod_revision = revision;
  e.prev_kv = std::move(prev);
  return e;
}

WatchEvent PutEnd(const Lid& lid, std::string value, int64_t revision) {
  WatchEvent e;
  e.type = WatchEvent::Type::kPut;
  e.kv.key = EndKey(lid);
  e.kv.value = std::move(value);
  e.kv.mod_revision = revision;
  e.kv.version = 1;
  return e;
}

TEST(EventDeriverTest, EachRevisionBecomesTheEventItsTransactionMeans) {
  const Lid a{"demo", 1, 0, 0};
  Record r1{a, 0, {"tcp://127.0.0.1:1"}, {}, 0};
  Record r2{a, 0, {"tcp://127.0.0.1:2"}, {}, 0};
  const std::string v1 = EncodeRecordValue(r1), v2 = EncodeRecordValue(r2);
  auto kv = [&](const std::string& value, int64_t revision) {
    KeyValue k;
    k.key = RecordKey(a);
    k.value = value;
    k.mod_revision = revision;
    return k;
  };
  WatchResponse response;
  response.events = {
      Put(a, v1, 11, 1),                     // JOINED
      Put(a, v2, 12, 2, kv(v1, 11)),         // MIGRATED from 11
      PutEnd(a, "superseded epoch 12", 13),  // forced JOIN: FAILED + JOINED
      Put(a, v1, 13, 3, kv(v2, 12)),
      PutEnd(a, "reported by demo/g2/s0/r0", 14),  // REPORT_FAILED
      Delete(RecordKey(a), 14, kv(v1, 13)),
      Delete(CredentialKey(a), 14, std::nullopt),  // ignored
      Put(a, v2, 15, 1),                           // JOINED again
      Delete(RecordKey(a), 16, kv(v2, 15)),        // lease ran out
      Put(a, v1, 17, 1),
      PutEnd(a, "left", 18),  // LEAVE
      Delete(RecordKey(a), 18, kv(v1, 17)),
  };
  WatchEvent foreign;
  foreign.kv.key = "/elsewhere";
  foreign.kv.mod_revision = 19;
  response.events.push_back(foreign);
  EventDeriver deriver(10);
  std::vector<Event> events = deriver.Apply(response);
  ASSERT_EQ(events.size(), 9u);
  auto expect = [&](size_t i, EventKind kind, uint64_t revision, uint64_t epoch,
                    uint64_t model_previous) {
    SCOPED_TRACE(i);
    EXPECT_EQ(events[i].kind, kind);
    EXPECT_EQ(events[i].revision, revision);
    EXPECT_EQ(events[i].record.epoch, epoch);
    EXPECT_EQ(events[i].record.lid, a);
    EXPECT_EQ(events[i].model_previous, model_previous);
  };
  expect(0, EventKind::kJoined, 11, 11, 10);
  EXPECT_EQ(events[0].record.addresses, r1.addresses);
  expect(1, EventKind::kMigrated, 12, 12, 11);
  EXPECT_EQ(events[1].previous_epoch, 11u);
  EXPECT_EQ(events[1].record.addresses, r2.addresses);
  expect(2, EventKind::kFailed, 13, 12, 12);
  EXPECT_EQ(events[2].reason, "superseded by epoch 13");
  EXPECT_EQ(events[2].record.addresses, r2.addresses);
  expect(3, EventKind::kJoined, 13, 13, 12);
  expect(4, EventKind::kFailed, 14, 13, 13);
  EXPECT_EQ(events[4].reason, "reported by demo/g2/s0/r0");
  expect(5, EventKind::kJoined, 15, 15, 14);
  expect(6, EventKind::kFailed, 16, 15, 15);
  EXPECT_EQ(events[6].reason, "lease-expired");
  expect(7, EventKind::kJoined, 17, 17, 16);
  expect(8, EventKind::kLeft, 18, 17, 17);
  EXPECT_EQ(deriver.skipped(), 1u);
  EXPECT_EQ(deriver.last_revision(), 19u);  // a revision of foreign keys only still counts
  // A watch that resumed before what it delivered repeats nothing.
  EXPECT_TRUE(deriver.Apply(response).empty());
}

}  // namespace
}  // namespace connex::directory::etcd
