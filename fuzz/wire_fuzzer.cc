// libFuzzer target: the wire decoder and the directory message decoders must reject any byte
// string with a Status, never crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "connex/base/codec.h"
#include "connex/directory/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<connex::wire::Frame> frame = connex::wire::DecodeFrame(bytes);
  if (!frame.ok()) return 0;
  const connex::wire::MapView& body = frame->body;
  (void)connex::directory::DecodeEvent(body);
  (void)connex::directory::DecodeSnapshot(body);
  (void)connex::directory::DecodeError(body);
  if (body.Has("record")) {
    absl::StatusOr<connex::wire::MapView> record = body.Map("record");
    if (record.ok()) (void)connex::directory::DecodeRecord(*record);
  }
  (void)body.Str("lid");
  (void)body.StrList("addresses");
  (void)body.StrMap("metadata");
  (void)body.UintOr("epoch", 0);
  return 0;
}
