#include "connex/base/codec.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::wire {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CodecTest, RoundTripsEveryFieldKind) {
  MapBuilder nested;
  nested.Str("addr", "tcp://127.0.0.1:5").Uint("n", 3);
  MapBuilder item;
  item.Uint("x", 1);
  ListBuilder list;
  list.AddMap(item).AddMap(item);
  MapBuilder body;
  body.Str("lid", "demo/g1/s0/r1")
      .Bin("blob", std::string("\0\1\2", 3))
      .Uint("epoch", 9)
      .Int("delta", -5)
      .Bool("ok", true)
      .Double("ratio", 0.25)
      .StrList("addresses", {"a", "b"})
      .UintList("ids", {1, 2, 3})
      .Map("meta", nested)
      .List("items", list);
  std::string bytes = EncodeFrame("JOIN", body);

  absl::StatusOr<Frame> frame = DecodeFrame(bytes);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->version, kVersion);
  EXPECT_EQ(frame->type, "JOIN");
  const MapView& b = frame->body;
  EXPECT_EQ(*b.Str("lid"), "demo/g1/s0/r1");
  EXPECT_EQ(*b.Bin("blob"), std::string_view("\0\1\2", 3));
  EXPECT_EQ(*b.Uint("epoch"), 9u);
  EXPECT_EQ(*b.Int("delta"), -5);
  EXPECT_TRUE(*b.Bool("ok"));
  EXPECT_EQ(*b.Double("ratio"), 0.25);
  EXPECT_THAT(*b.StrList("addresses"), ElementsAre("a", "b"));
  EXPECT_THAT(*b.UintList("ids"), ElementsAre(1, 2, 3));
  EXPECT_EQ(*b.Map("meta")->Str("addr"), "tcp://127.0.0.1:5");
  ASSERT_EQ(b.List("items")->size(), 2u);
  EXPECT_EQ(*b.List("items")->MapAt(1)->Uint("x"), 1u);
  EXPECT_EQ(*b.UintOr("absent", 17), 17u);
  EXPECT_EQ(*b.StrOr("absent", "d"), "d");
}

TEST(CodecTest, EntriesOfAnEncodedMapAreAppendedAsTheirOwn) {
  MapBuilder cached;
  cached.Uint("revision", 7).StrList("records", {"a", "b"});
  MapBuilder body;
  body.Uint("id", 3).Entries(cached).Entries(MapBuilder().Bool("last", true));
  EXPECT_EQ(body.size(), 4u);
  absl::StatusOr<Frame> frame = DecodeFrame(EncodeFrame("OK", body));
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->body.size(), 4u);
  EXPECT_EQ(*frame->body.Uint("id"), 3u);
  EXPECT_EQ(*frame->body.Uint("revision"), 7u);
  EXPECT_THAT(*frame->body.StrList("records"), ElementsAre("a", "b"));
  EXPECT_TRUE(*frame->body.Bool("last"));
}

TEST(CodecTest, ErrorsNameTheField) {
  MapBuilder body;
  body.Uint("lid", 3).Int("epoch", -1);
  MapBuilder outer;
  outer.Map("inner", body);
  absl::StatusOr<Frame> frame = DecodeFrame(EncodeFrame("JOIN", outer));
  ASSERT_TRUE(frame.ok());
  absl::StatusOr<MapView> inner = frame->body.Map("inner");
  ASSERT_TRUE(inner.ok());
  EXPECT_THAT(inner->Str("lid").status().message(),
              HasSubstr("JOIN.inner.lid: expected string, found integer"));
  EXPECT_THAT(inner->Uint("epoch").status().message(),
              HasSubstr("JOIN.inner.epoch: expected a non-negative integer, found -1"));
  EXPECT_THAT(inner->Str("nope").status().message(), HasSubstr("JOIN.inner.nope: missing"));
  EXPECT_THAT(frame->body.UintOr("inner", 1).status().message(), HasSubstr("found map"));
}

TEST(CodecTest, RejectsMalformedFrames) {
  EXPECT_THAT(DecodeFrame("").status().message(), HasSubstr("empty frame"));
  EXPECT_THAT(DecodeFrame("\x93\x01").status().message(), HasSubstr("truncated"));
  EXPECT_THAT(DecodeFrame("\x01").status().message(), HasSubstr("array [version, type, body]"));
  std::string good = EncodeFrame("PING", MapBuilder());
  EXPECT_THAT(DecodeFrame(good + "x").status().message(), HasSubstr("1 trailing bytes"));
  // version 99
  std::string v99 = good;
  v99[1] = 99;
  EXPECT_THAT(DecodeFrame(v99).status().message(), HasSubstr("version 99 is not supported"));
  // body not a map
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack_uint32(1);
  p.pack(std::string("JOIN"));
  p.pack_uint32(5);
  EXPECT_THAT(DecodeFrame(std::string_view(buf.data(), buf.size())).status().message(),
              HasSubstr("JOIN: expected map, found integer"));
}

TEST(CodecTest, EnforcesLimits) {
  MapBuilder body;
  body.Str("big", std::string(2000, 'x'));
  std::string bytes = EncodeFrame("X", body);
  Limits small;
  small.max_string = 1000;
  EXPECT_THAT(DecodeFrame(bytes, small).status().message(), HasSubstr("size limit"));
  small = Limits();
  small.max_frame_bytes = 100;
  EXPECT_THAT(DecodeFrame(bytes, small).status().message(), HasSubstr("exceeds the limit of 100"));
  // An array header claiming 2^32-1 elements must not allocate them.
  std::string huge = "\x93\x01\xa1X\xdd\xff\xff\xff\xff";
  EXPECT_FALSE(DecodeFrame(huge).ok());
  // Deep nesting.
  std::string deep = "\x93\x01\xa1X";
  for (int i = 0; i < 100; ++i) deep += "\x91";
  deep += "\x80";
  EXPECT_FALSE(DecodeFrame(deep).ok());
}

TEST(CodecTest, RandomBytesNeverCrash) {
  std::mt19937 rng(1234);
  std::string good;
  {
    MapBuilder body;
    body.Str("lid", "demo/g1/s0/r1").Uint("epoch", 3).StrList("addresses", {"tcp://x"});
    good = EncodeFrame("JOIN", body);
  }
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = good;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    absl::StatusOr<Frame> frame = DecodeFrame(bytes);
    if (frame.ok()) {
      (void)frame->body.Str("lid");
      (void)frame->body.StrList("addresses");
    }
  }
}

}  // namespace
}  // namespace connex::wire
