#include "connex/directory/protocol.h"

#include "connex/base/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory {
namespace {

using ::testing::HasSubstr;

TEST(ProtocolTest, EventRoundTrip) {
  Event e;
  e.revision = 42;
  e.kind = EventKind::kMigrated;
  e.record = Record{Lid{"demo", 1, 0, 1}, 9, {"tcp://a:1", "shm://x"}, {{"k", "v"}}, 1500};
  e.previous_epoch = 7;
  wire::MapBuilder body;
  EncodeEvent(e, 77, &body);
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(wire::EncodeFrame(kEvent, body));
  ASSERT_TRUE(frame.ok());
  absl::StatusOr<Event> back = DecodeEvent(frame->body);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->revision, 42u);
  EXPECT_EQ(back->kind, EventKind::kMigrated);
  EXPECT_EQ(back->record, e.record);
  EXPECT_EQ(back->previous_epoch, 7u);
  EXPECT_EQ(*frame->body.Uint("incarnation"), 77u);
}

TEST(ProtocolTest, BadLidInRecordIsNamed) {
  wire::MapBuilder record;
  record.Str("lid", "demo/g1/sX/r0").Uint("epoch", 1).StrList("addresses", {});
  wire::MapBuilder body;
  body.Map("record", record);
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(wire::EncodeFrame(kEvent, body));
  ASSERT_TRUE(frame.ok());
  absl::StatusOr<wire::MapView> r = frame->body.Map("record");
  absl::StatusOr<Record> decoded = DecodeRecord(*r);
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("EVENT.record.lid"));
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("'sX'"));
}

TEST(ProtocolTest, ErrorRoundTrip) {
  std::string bytes = EncodeError(5, absl::PermissionDeniedError("wrong directory token"));
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(bytes);
  ASSERT_TRUE(frame.ok());
  absl::Status s = DecodeError(frame->body);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "wrong directory token");
}

TEST(ProtocolTest, ValidateRegistration) {
  EXPECT_TRUE(ValidateRegistration({"tcp://127.0.0.1:5", "shm://x"}, {{"a", "b"}}).ok());
  EXPECT_THAT(std::string(ValidateRegistration({""}, {}).message()), HasSubstr("empty"));
  EXPECT_THAT(std::string(ValidateRegistration({"x"}, {}).message()),
              HasSubstr("not self-describing"));
}

}  // namespace
}  // namespace connex::directory
