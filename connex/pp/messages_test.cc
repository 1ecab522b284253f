#include "connex/pp/messages.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::HasSubstr;

Hop MakeHop(uint32_t stage) {
  return Hop{Lid{"m", stage, 0, 1}, 40 + stage, "pp+mem://3", {"mem://x"}};
}

TEST(MessagesTest, StepRoundTrip) {
  StepSignal s;
  s.corr = 11;
  s.step = 22;
  s.attempt = 3;
  s.owner = MakeHop(0);
  s.origin = MakeHop(1);
  s.route = {MakeHop(1), MakeHop(2)};
  s.hop = 1;
  s.request_ids = {5, 6};
  s.start_positions = {0, 7};
  s.num_tokens = {4, 1};
  s.layout = {TensorLayout{"hidden", DType::kF32, {5, 8}, 64, 160}};
  s.remote_addr = 0xdeadbeef;
  s.length = 224;
  absl::StatusOr<Signal> back = Decode(Encode(s));
  ASSERT_TRUE(back.ok()) << back.status();
  const StepSignal& d = std::get<StepSignal>(*back);
  EXPECT_EQ(d.corr, 11u);
  EXPECT_EQ(d.attempt, 3u);
  EXPECT_EQ(d.route, s.route);
  EXPECT_EQ(d.target().lid, (Lid{"m", 2, 0, 1}));
  EXPECT_EQ(d.num_tokens, s.num_tokens);
  EXPECT_EQ(d.layout[0].shape, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(d.remote_addr, 0xdeadbeefu);
}

TEST(MessagesTest, OtherSignalsRoundTrip) {
  ResultSignal r{1, 2, Lid{"m", 3, 0, 0}, {7, 8}, {100, 5}};
  auto back = Decode(Encode(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<ResultSignal>(*back).tokens, (std::vector<int32_t>{100, 5}));
  auto ack = Decode(Encode(AckSignal{9, Lid{"m", 1, 0, 0}, 9, "fenced"}));
  ASSERT_TRUE(ack.ok());
  EXPECT_EQ(std::get<AckSignal>(*ack).message, "fenced");
}

TEST(MessagesTest, MalformedSignalsAreNamed) {
  EXPECT_THAT(std::string(Decode("garbage").status().message()), HasSubstr("wire"));
  StepSignal s;
  s.owner = MakeHop(0);
  s.origin = MakeHop(0);
  s.route = {MakeHop(1)};
  s.hop = 4;
  EXPECT_THAT(std::string(Decode(Encode(s)).status().message()),
              HasSubstr("STEP.hop: 4 is outside"));
  s.hop = 0;
  s.request_ids = {1};
  EXPECT_THAT(std::string(Decode(Encode(s)).status().message()), HasSubstr("differ in length"));
}

TEST(TensorDictTest, PackUnpackAndBadLayouts) {
  TensorDict d;
  d.Set("a", Tensor::Of<int32_t>({3}, std::vector<int32_t>{1, 2, 3}));
  d.Set("b", Tensor::Of<float>({2, 2}, std::vector<float>{1, 2, 3, 4}));
  std::vector<uint8_t> buf(PackedSize(d));
  auto layout = Pack(d, buf.data());
  auto back = Unpack(layout, buf.data(), buf.size());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == d);
  layout[1].size += 4;
  EXPECT_THAT(std::string(Unpack(layout, buf.data(), buf.size()).status().message()),
              HasSubstr("tensor 'b'"));
}

// Issue 9 finding 7: [2^31, 2^31] F32 is 2^64 bytes; the product wrapped to 0 and a layout of
// size 0 was accepted.
TEST(TensorDictTest, ALayoutWhoseByteSizeOverflowsIsRefused) {
  std::vector<uint8_t> buf(64);
  std::vector<TensorLayout> layout = {
      TensorLayout{"h", DType::kF32, {int64_t{1} << 31, int64_t{1} << 31}, 0, 0}};
  absl::Status st = Unpack(layout, buf.data(), buf.size()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tensor 'h'"));
  EXPECT_EQ(ByteSize(std::vector<int64_t>{int64_t{1} << 31, int64_t{1} << 31}, DType::kF32),
            std::nullopt);
  EXPECT_EQ(ByteSize(std::vector<int64_t>{3, 5}, DType::kI64), 120u);
}

TEST(MessagesTest, TicketsTokensAndEpochsRoundTrip) {
  StepSignal s;
  s.owner = MakeHop(0);
  s.origin = MakeHop(0);
  s.route = {MakeHop(1)};
  s.owner_token = 0xfeedfacecafebeefull;
  s.ticket = 77;
  auto step = Decode(Encode(s));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(std::get<StepSignal>(*step).owner_token, 0xfeedfacecafebeefull);
  EXPECT_EQ(std::get<StepSignal>(*step).ticket, 77u);
  ResultSignal r{1, 2, Lid{"m", 3, 0, 0}, {7}, {100}, 41, 77};
  auto result = Decode(Encode(r));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(std::get<ResultSignal>(*result).from_epoch, 41u);
  EXPECT_EQ(std::get<ResultSignal>(*result).ticket, 77u);
  StepErrorSignal e{1, 2, Lid{"m", 2, 0, 0}, {7, 8}, 13, "engine: out of memory", 42, 77};
  auto error = Decode(Encode(e));
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(std::get<StepErrorSignal>(*error).message, "engine: out of memory");
  EXPECT_EQ(std::get<StepErrorSignal>(*error).request_ids, (std::vector<uint64_t>{7, 8}));
  ReleaseSignal rel{Lid{"m", 0, 0, 0}, {7}, 99, 5, "pp+mem://1"};
  auto release = Decode(Encode(rel));
  ASSERT_TRUE(release.ok());
  EXPECT_EQ(std::get<ReleaseSignal>(*release).owner_token, 99u);
  EXPECT_EQ(std::get<ReleaseSignal>(*release).reply_to, "pp+mem://1");
  auto released = Decode(Encode(ReleasedSignal{5, Lid{"m", 1, 0, 0}}));
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(std::get<ReleasedSignal>(*released).nonce, 5u);
}

// KV standby: MIRROR, MIRRORED, MIRROR_DROP, and STEP.rewind / MISSING.held (omitted when empty,
// so that a stage without them reads them as before).
TEST(MessagesTest, KvStandbySignalsRoundTripAndBadOnesAreNamed) {
  MirrorSignal m;
  m.corr = 5;
  m.origin = MakeHop(1);
  m.target = Lid{"m", 1, 0, 2};
  m.target_epoch = 9;
  m.owner = MakeHop(0);
  m.owner_token = 0xabcdef;
  m.request_ids = {3, 4};
  m.from = {0, 10};
  m.to = {7, 11};
  m.layout = {TensorLayout{"0/hash", DType::kI64, {7}, 0, 56}};
  m.remote_addr = 0x1000;
  m.length = 120;
  auto back = Decode(Encode(m));
  ASSERT_TRUE(back.ok()) << back.status();
  const MirrorSignal& d = std::get<MirrorSignal>(*back);
  EXPECT_EQ(d.target, m.target);
  EXPECT_EQ(d.owner, m.owner);
  EXPECT_EQ(d.from, m.from);
  EXPECT_EQ(d.to, m.to);
  EXPECT_EQ(d.layout[0].name, "0/hash");
  m.to = {7, 10};  // an empty range
  EXPECT_THAT(std::string(Decode(Encode(m)).status().message()),
              HasSubstr("MIRROR: request 4: positions [10, 10) are empty"));
  MirroredSignal r{5, Lid{"m", 1, 0, 2}, 0, "", {3, 4}, {7, -1}};
  auto mirrored = Decode(Encode(r));
  ASSERT_TRUE(mirrored.ok()) << mirrored.status();
  EXPECT_EQ(std::get<MirroredSignal>(*mirrored).held, (std::vector<int64_t>{7, -1}));
  MirrorDropSignal drop{Lid{"m", 1, 0, 1}, 41, Lid{"m", 0, 0, 1}, 0xabcdef, {3}};
  auto dropped = Decode(Encode(drop));
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(std::get<MirrorDropSignal>(*dropped).owner_token, 0xabcdefu);

  StepSignal s;
  s.owner = MakeHop(0);
  s.origin = MakeHop(0);
  s.route = {MakeHop(1)};
  s.request_ids = {1, 2};
  s.start_positions = {5, 6};
  s.num_tokens = {1, 1};
  s.rewind = {2};
  auto step = Decode(Encode(s));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(std::get<StepSignal>(*step).rewind, (std::vector<uint64_t>{2}));
  EXPECT_FALSE(std::get<StepSignal>(*step).has_handoff());
  // Prefill-decode: the decode instance a prefill step's state goes to.
  s.handoff = MakeHop(2);
  step = Decode(Encode(s));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(std::get<StepSignal>(*step).handoff, MakeHop(2));
  MissingSignal missing{1, 2, Lid{"m", 1, 0, 0}, {7, 8}, 41, 77, {0, 12}};
  auto miss = Decode(Encode(missing));
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(std::get<MissingSignal>(*miss).held, (std::vector<int32_t>{0, 12}));
  missing.held = {};
  miss = Decode(Encode(missing));
  ASSERT_TRUE(miss.ok());
  EXPECT_TRUE(std::get<MissingSignal>(*miss).held.empty());
}

}  // namespace
}  // namespace connex::pp
