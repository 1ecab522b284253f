#include "connex/pp/messages.h"

#include "connex/base/codec.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::pp {
namespace {

using wire::ListBuilder;
using wire::ListView;
using wire::MapBuilder;
using wire::MapView;

constexpr size_t kMaxRoute = 64;
constexpr size_t kMaxBatch = 1 << 16;

void PutHop(MapBuilder& m, const Hop& hop) {
  m.Str("lid", hop.lid.ToString())
      .Uint("epoch", hop.epoch)
      .Str("signal", hop.signal)
      .StrList("addresses", hop.addresses);
}

absl::StatusOr<Lid> GetLid(const MapView& m, std::string_view key) {
  CONNEX_ASSIGN_OR_RETURN(std::string text, m.Str(key));
  absl::StatusOr<Lid> lid = Lid::Parse(text);
  if (!lid.ok()) return Annotate(lid.status(), StrCat(m.path(), ".", key));
  return lid;
}

absl::StatusOr<Hop> GetHop(const MapView& m) {
  Hop hop;
  CONNEX_ASSIGN_OR_RETURN(hop.lid, GetLid(m, "lid"));
  CONNEX_ASSIGN_OR_RETURN(hop.epoch, m.Uint("epoch"));
  CONNEX_ASSIGN_OR_RETURN(hop.signal, m.Str("signal"));
  CONNEX_ASSIGN_OR_RETURN(hop.addresses, m.StrList("addresses"));
  return hop;
}

std::vector<uint64_t> ToU64(const std::vector<int32_t>& v) {
  std::vector<uint64_t> out;
  for (int32_t x : v) out.push_back(static_cast<uint32_t>(x));
  return out;
}

absl::StatusOr<std::vector<int32_t>> GetI32List(const MapView& m, std::string_view key) {
  CONNEX_ASSIGN_OR_RETURN(std::vector<uint64_t> raw, m.UintList(key));
  std::vector<int32_t> out;
  for (uint64_t x : raw) {
    if (x > 0x7fffffffu)
      return absl::InvalidArgumentError(StrCat(m.path(), ".", key, ": ", x, " out of range"));
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

absl::StatusOr<uint32_t> GetU32(const MapView& m, std::string_view key) {
  CONNEX_ASSIGN_OR_RETURN(uint64_t v, m.Uint(key));
  if (v > 0xffffffffu)
    return absl::InvalidArgumentError(StrCat(m.path(), ".", key, ": out of range"));
  return static_cast<uint32_t>(v);
}

void PutLayout(const std::vector<TensorLayout>& entries, ListBuilder& layout) {
  for (const TensorLayout& l : entries) {
    MapBuilder m;
    std::vector<uint64_t> shape;
    for (int64_t d : l.shape) shape.push_back(static_cast<uint64_t>(d));
    m.Str("name", l.name)
        .Str("dtype", DTypeName(l.dtype))
        .UintList("shape", shape)
        .Uint("offset", l.offset)
        .Uint("size", l.size);
    layout.AddMap(m);
  }
}

absl::StatusOr<std::vector<TensorLayout>> GetLayout(const MapView& b) {
  std::vector<TensorLayout> out;
  CONNEX_ASSIGN_OR_RETURN(ListView layout, b.List("layout"));
  for (size_t i = 0; i < layout.size(); ++i) {
    CONNEX_ASSIGN_OR_RETURN(MapView m, layout.MapAt(i));
    TensorLayout l;
    CONNEX_ASSIGN_OR_RETURN(l.name, m.Str("name"));
    CONNEX_ASSIGN_OR_RETURN(std::string dtype, m.Str("dtype"));
    std::optional<DType> parsed = ParseDType(dtype);
    if (!parsed)
      return absl::InvalidArgumentError(StrCat(m.path(), ".dtype: unknown '", dtype, "'"));
    l.dtype = *parsed;
    CONNEX_ASSIGN_OR_RETURN(std::vector<uint64_t> shape, m.UintList("shape"));
    for (uint64_t d : shape) {
      if (d > (1ull << 40))
        return absl::InvalidArgumentError(StrCat(m.path(), ".shape: dimension too large"));
      l.shape.push_back(static_cast<int64_t>(d));
    }
    CONNEX_ASSIGN_OR_RETURN(l.offset, m.Uint("offset"));
    CONNEX_ASSIGN_OR_RETURN(l.size, m.Uint("size"));
    out.push_back(std::move(l));
  }
  return out;
}

// Signed positions on the wire (-1 is "dropped"), as two's complement.
std::vector<uint64_t> FromI64(const std::vector<int64_t>& v) {
  return std::vector<uint64_t>(v.begin(), v.end());
}

struct EncodeVisitor {
  std::string operator()(const StepSignal& s) const {
    MapBuilder owner, origin;
    PutHop(owner, s.owner);
    PutHop(origin, s.origin);
    ListBuilder route;
    for (const Hop& h : s.route) {
      MapBuilder m;
      PutHop(m, h);
      route.AddMap(m);
    }
    ListBuilder layout;
    PutLayout(s.layout, layout);
    MapBuilder body;
    body.Uint("corr", s.corr)
        .Uint("step", s.step)
        .Uint("attempt", s.attempt)
        .Map("owner", owner)
        .Map("origin", origin)
        .Uint("hop", s.hop)
        .List("route", route)
        .UintList("request_ids", s.request_ids)
        .UintList("start_positions", ToU64(s.start_positions))
        .UintList("num_tokens", ToU64(s.num_tokens))
        .List("layout", layout)
        .Uint("remote_addr", s.remote_addr)
        .Uint("length", s.length)
        .Uint("owner_token", s.owner_token)
        .Uint("ticket", s.ticket);
    if (!s.rewind.empty()) body.UintList("rewind", s.rewind);
    if (s.has_handoff()) {
      MapBuilder handoff;
      PutHop(handoff, s.handoff);
      body.Map("handoff", handoff);
    }
    return wire::EncodeFrame("STEP", body);
  }
  std::string operator()(const AckSignal& s) const {
    MapBuilder body;
    body.Uint("corr", s.corr)
        .Str("from", s.from.ToString())
        .Uint("code", s.code)
        .Str("message", s.message);
    return wire::EncodeFrame("ACK", body);
  }
  std::string operator()(const ResultSignal& s) const {
    MapBuilder body;
    body.Uint("step", s.step)
        .Uint("attempt", s.attempt)
        .Str("from", s.from.ToString())
        .UintList("request_ids", s.request_ids)
        .UintList("tokens", ToU64(s.tokens))
        .Uint("from_epoch", s.from_epoch)
        .Uint("ticket", s.ticket);
    return wire::EncodeFrame("RESULT", body);
  }
  std::string operator()(const MissingSignal& s) const {
    MapBuilder body;
    body.Uint("step", s.step)
        .Uint("attempt", s.attempt)
        .Str("from", s.from.ToString())
        .UintList("request_ids", s.request_ids)
        .Uint("from_epoch", s.from_epoch)
        .Uint("ticket", s.ticket);
    if (!s.held.empty()) body.UintList("held", ToU64(s.held));
    return wire::EncodeFrame("MISSING", body);
  }
  std::string operator()(const HopFailedSignal& s) const {
    MapBuilder body;
    body.Uint("step", s.step)
        .Uint("attempt", s.attempt)
        .Str("from", s.from.ToString())
        .Uint("hop", s.hop)
        .Uint("code", s.code)
        .Str("reason", s.reason)
        .Uint("from_epoch", s.from_epoch)
        .Uint("ticket", s.ticket);
    return wire::EncodeFrame("HOP_FAILED", body);
  }
  std::string operator()(const StepErrorSignal& s) const {
    MapBuilder body;
    body.Uint("step", s.step)
        .Uint("attempt", s.attempt)
        .Str("from", s.from.ToString())
        .UintList("request_ids", s.request_ids)
        .Uint("code", s.code)
        .Str("message", s.message)
        .Uint("from_epoch", s.from_epoch)
        .Uint("ticket", s.ticket);
    return wire::EncodeFrame("STEP_ERROR", body);
  }
  std::string operator()(const ReleaseSignal& s) const {
    MapBuilder body;
    body.Str("from", s.from.ToString())
        .UintList("request_ids", s.request_ids)
        .Uint("owner_token", s.owner_token)
        .Uint("nonce", s.nonce)
        .Str("reply_to", s.reply_to)
        .Uint("upto_step", s.upto_step);
    return wire::EncodeFrame("RELEASE", body);
  }
  std::string operator()(const ReleasedSignal& s) const {
    MapBuilder body;
    body.Uint("nonce", s.nonce).Str("from", s.from.ToString());
    return wire::EncodeFrame("RELEASED", body);
  }
  std::string operator()(const PingSignal& s) const {
    MapBuilder body;
    body.Uint("nonce", s.nonce).Str("from", s.from.ToString()).Str("reply_to", s.reply_to);
    return wire::EncodeFrame("PING", body);
  }
  std::string operator()(const PongSignal& s) const {
    MapBuilder body;
    body.Uint("nonce", s.nonce).Str("from", s.from.ToString()).Uint("epoch", s.epoch);
    return wire::EncodeFrame("PONG", body);
  }
  std::string operator()(const MirrorSignal& s) const {
    MapBuilder origin, owner;
    PutHop(origin, s.origin);
    PutHop(owner, s.owner);
    ListBuilder layout;
    PutLayout(s.layout, layout);
    MapBuilder body;
    body.Uint("corr", s.corr)
        .Map("origin", origin)
        .Str("target", s.target.ToString())
        .Uint("target_epoch", s.target_epoch)
        .Map("owner", owner)
        .Uint("owner_token", s.owner_token)
        .UintList("request_ids", s.request_ids)
        .UintList("from", ToU64(s.from))
        .UintList("to", ToU64(s.to))
        .List("layout", layout)
        .Uint("remote_addr", s.remote_addr)
        .Uint("length", s.length);
    return wire::EncodeFrame("MIRROR", body);
  }
  std::string operator()(const MirroredSignal& s) const {
    MapBuilder body;
    body.Uint("corr", s.corr)
        .Str("from", s.from.ToString())
        .Uint("code", s.code)
        .Str("message", s.message)
        .UintList("request_ids", s.request_ids)
        .UintList("held", FromI64(s.held));
    return wire::EncodeFrame("MIRRORED", body);
  }
  std::string operator()(const MirrorDropSignal& s) const {
    MapBuilder body;
    body.Str("from", s.from.ToString())
        .Uint("from_epoch", s.from_epoch)
        .Str("owner", s.owner.ToString())
        .Uint("owner_token", s.owner_token)
        .UintList("request_ids", s.request_ids);
    return wire::EncodeFrame("MIRROR_DROP", body);
  }
};

absl::StatusOr<StepSignal> DecodeStep(const MapView& b) {
  StepSignal s;
  CONNEX_ASSIGN_OR_RETURN(s.corr, b.Uint("corr"));
  CONNEX_ASSIGN_OR_RETURN(s.step, b.Uint("step"));
  CONNEX_ASSIGN_OR_RETURN(s.attempt, GetU32(b, "attempt"));
  CONNEX_ASSIGN_OR_RETURN(MapView owner, b.Map("owner"));
  CONNEX_ASSIGN_OR_RETURN(s.owner, GetHop(owner));
  CONNEX_ASSIGN_OR_RETURN(MapView origin, b.Map("origin"));
  CONNEX_ASSIGN_OR_RETURN(s.origin, GetHop(origin));
  CONNEX_ASSIGN_OR_RETURN(s.hop, GetU32(b, "hop"));
  CONNEX_ASSIGN_OR_RETURN(ListView route, b.List("route"));
  if (route.size() == 0 || route.size() > kMaxRoute) {
    return absl::InvalidArgumentError(StrCat("STEP.route: ", route.size(), " hops"));
  }
  for (size_t i = 0; i < route.size(); ++i) {
    CONNEX_ASSIGN_OR_RETURN(MapView m, route.MapAt(i));
    CONNEX_ASSIGN_OR_RETURN(Hop h, GetHop(m));
    s.route.push_back(std::move(h));
  }
  if (s.hop >= s.route.size()) {
    return absl::InvalidArgumentError(
        StrCat("STEP.hop: ", s.hop, " is outside the ", s.route.size(), "-hop route"));
  }
  CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
  CONNEX_ASSIGN_OR_RETURN(s.start_positions, GetI32List(b, "start_positions"));
  CONNEX_ASSIGN_OR_RETURN(s.num_tokens, GetI32List(b, "num_tokens"));
  if (s.request_ids.size() > kMaxBatch || s.start_positions.size() != s.request_ids.size() ||
      s.num_tokens.size() != s.request_ids.size()) {
    return absl::InvalidArgumentError(
        "STEP: request_ids, start_positions and num_tokens differ in length");
  }
  CONNEX_ASSIGN_OR_RETURN(s.layout, GetLayout(b));
  CONNEX_ASSIGN_OR_RETURN(s.remote_addr, b.Uint("remote_addr"));
  CONNEX_ASSIGN_OR_RETURN(s.length, b.Uint("length"));
  CONNEX_ASSIGN_OR_RETURN(s.owner_token, b.Uint("owner_token"));
  CONNEX_ASSIGN_OR_RETURN(s.ticket, b.Uint("ticket"));
  if (b.Has("rewind")) {
    CONNEX_ASSIGN_OR_RETURN(s.rewind, b.UintList("rewind"));
    if (s.rewind.size() > s.request_ids.size()) {
      return absl::InvalidArgumentError("STEP.rewind: more requests than the step has");
    }
  }
  if (b.Has("handoff")) {
    CONNEX_ASSIGN_OR_RETURN(MapView handoff, b.Map("handoff"));
    CONNEX_ASSIGN_OR_RETURN(s.handoff, GetHop(handoff));
    if (!s.has_handoff()) return absl::InvalidArgumentError("STEP.handoff: an empty LID");
  }
  return s;
}

absl::StatusOr<MirrorSignal> DecodeMirror(const MapView& b) {
  MirrorSignal s;
  CONNEX_ASSIGN_OR_RETURN(s.corr, b.Uint("corr"));
  CONNEX_ASSIGN_OR_RETURN(MapView origin, b.Map("origin"));
  CONNEX_ASSIGN_OR_RETURN(s.origin, GetHop(origin));
  CONNEX_ASSIGN_OR_RETURN(s.target, GetLid(b, "target"));
  CONNEX_ASSIGN_OR_RETURN(s.target_epoch, b.Uint("target_epoch"));
  CONNEX_ASSIGN_OR_RETURN(MapView owner, b.Map("owner"));
  CONNEX_ASSIGN_OR_RETURN(s.owner, GetHop(owner));
  CONNEX_ASSIGN_OR_RETURN(s.owner_token, b.Uint("owner_token"));
  CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
  CONNEX_ASSIGN_OR_RETURN(s.from, GetI32List(b, "from"));
  CONNEX_ASSIGN_OR_RETURN(s.to, GetI32List(b, "to"));
  if (s.request_ids.size() > kMaxBatch || s.from.size() != s.request_ids.size() ||
      s.to.size() != s.request_ids.size()) {
    return absl::InvalidArgumentError("MIRROR: request_ids, from and to differ in length");
  }
  for (size_t i = 0; i < s.from.size(); ++i) {
    if (s.from[i] >= s.to[i]) {
      return absl::InvalidArgumentError(StrCat("MIRROR: request ", s.request_ids[i],
                                               ": positions [", s.from[i], ", ", s.to[i],
                                               ") are empty"));
    }
  }
  CONNEX_ASSIGN_OR_RETURN(s.layout, GetLayout(b));
  CONNEX_ASSIGN_OR_RETURN(s.remote_addr, b.Uint("remote_addr"));
  CONNEX_ASSIGN_OR_RETURN(s.length, b.Uint("length"));
  return s;
}

}  // namespace

std::string Encode(const Signal& signal) { return std::visit(EncodeVisitor{}, signal); }

absl::StatusOr<Signal> Decode(std::string_view frame) {
  CONNEX_ASSIGN_OR_RETURN(wire::Frame f, wire::DecodeFrame(frame));
  const MapView& b = f.body;
  if (f.type == "STEP") {
    CONNEX_ASSIGN_OR_RETURN(StepSignal s, DecodeStep(b));
    return Signal(std::move(s));
  }
  if (f.type == "ACK") {
    AckSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.corr, b.Uint("corr"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.code, GetU32(b, "code"));
    CONNEX_ASSIGN_OR_RETURN(s.message, b.StrOr("message", ""));
    return Signal(std::move(s));
  }
  if (f.type == "RESULT") {
    ResultSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.step, b.Uint("step"));
    CONNEX_ASSIGN_OR_RETURN(s.attempt, GetU32(b, "attempt"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
    CONNEX_ASSIGN_OR_RETURN(s.tokens, GetI32List(b, "tokens"));
    CONNEX_ASSIGN_OR_RETURN(s.from_epoch, b.Uint("from_epoch"));
    CONNEX_ASSIGN_OR_RETURN(s.ticket, b.Uint("ticket"));
    if (s.tokens.size() != s.request_ids.size()) {
      return absl::InvalidArgumentError("RESULT: request_ids and tokens differ in length");
    }
    return Signal(std::move(s));
  }
  if (f.type == "MISSING") {
    MissingSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.step, b.Uint("step"));
    CONNEX_ASSIGN_OR_RETURN(s.attempt, GetU32(b, "attempt"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
    CONNEX_ASSIGN_OR_RETURN(s.from_epoch, b.Uint("from_epoch"));
    CONNEX_ASSIGN_OR_RETURN(s.ticket, b.Uint("ticket"));
    if (b.Has("held")) {
      CONNEX_ASSIGN_OR_RETURN(s.held, GetI32List(b, "held"));
      if (s.held.size() != s.request_ids.size()) {
        return absl::InvalidArgumentError("MISSING: request_ids and held differ in length");
      }
    }
    return Signal(std::move(s));
  }
  if (f.type == "HOP_FAILED") {
    HopFailedSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.step, b.Uint("step"));
    CONNEX_ASSIGN_OR_RETURN(s.attempt, GetU32(b, "attempt"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.hop, GetU32(b, "hop"));
    CONNEX_ASSIGN_OR_RETURN(s.code, GetU32(b, "code"));
    CONNEX_ASSIGN_OR_RETURN(s.reason, b.StrOr("reason", ""));
    CONNEX_ASSIGN_OR_RETURN(s.from_epoch, b.Uint("from_epoch"));
    CONNEX_ASSIGN_OR_RETURN(s.ticket, b.Uint("ticket"));
    return Signal(std::move(s));
  }
  if (f.type == "STEP_ERROR") {
    StepErrorSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.step, b.Uint("step"));
    CONNEX_ASSIGN_OR_RETURN(s.attempt, GetU32(b, "attempt"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
    CONNEX_ASSIGN_OR_RETURN(s.code, GetU32(b, "code"));
    CONNEX_ASSIGN_OR_RETURN(s.message, b.StrOr("message", ""));
    CONNEX_ASSIGN_OR_RETURN(s.from_epoch, b.Uint("from_epoch"));
    CONNEX_ASSIGN_OR_RETURN(s.ticket, b.Uint("ticket"));
    return Signal(std::move(s));
  }
  if (f.type == "RELEASE") {
    ReleaseSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
    CONNEX_ASSIGN_OR_RETURN(s.owner_token, b.Uint("owner_token"));
    CONNEX_ASSIGN_OR_RETURN(s.nonce, b.Uint("nonce"));
    CONNEX_ASSIGN_OR_RETURN(s.reply_to, b.StrOr("reply_to", ""));
    CONNEX_ASSIGN_OR_RETURN(s.upto_step, b.Uint("upto_step"));
    return Signal(std::move(s));
  }
  if (f.type == "RELEASED") {
    ReleasedSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.nonce, b.Uint("nonce"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    return Signal(std::move(s));
  }
  if (f.type == "PING") {
    PingSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.nonce, b.Uint("nonce"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.reply_to, b.Str("reply_to"));
    return Signal(std::move(s));
  }
  if (f.type == "PONG") {
    PongSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.nonce, b.Uint("nonce"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.epoch, b.Uint("epoch"));
    return Signal(std::move(s));
  }
  if (f.type == "MIRROR") {
    CONNEX_ASSIGN_OR_RETURN(MirrorSignal s, DecodeMirror(b));
    return Signal(std::move(s));
  }
  if (f.type == "MIRRORED") {
    MirroredSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.corr, b.Uint("corr"));
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.code, GetU32(b, "code"));
    CONNEX_ASSIGN_OR_RETURN(s.message, b.StrOr("message", ""));
    CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
    CONNEX_ASSIGN_OR_RETURN(std::vector<uint64_t> held, b.UintList("held"));
    if (held.size() != s.request_ids.size()) {
      return absl::InvalidArgumentError("MIRRORED: request_ids and held differ in length");
    }
    for (uint64_t h : held) s.held.push_back(static_cast<int64_t>(h));
    return Signal(std::move(s));
  }
  if (f.type == "MIRROR_DROP") {
    MirrorDropSignal s;
    CONNEX_ASSIGN_OR_RETURN(s.from, GetLid(b, "from"));
    CONNEX_ASSIGN_OR_RETURN(s.from_epoch, b.Uint("from_epoch"));
    CONNEX_ASSIGN_OR_RETURN(s.owner, GetLid(b, "owner"));
    CONNEX_ASSIGN_OR_RETURN(s.owner_token, b.Uint("owner_token"));
    CONNEX_ASSIGN_OR_RETURN(s.request_ids, b.UintList("request_ids"));
    return Signal(std::move(s));
  }
  return absl::InvalidArgumentError(StrCat("pp: unknown signal type '", f.type, "'"));
}

}  // namespace connex::pp
