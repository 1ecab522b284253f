// libFuzzer target: any bytes, cut into pieces of a size the input picks, must give events or a
// DataLoss Status from the OpenAI stream reader — never crash, throw, hang or hold more than its
// bound.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "connex/serving/openai_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace connex::serving;
  if (size == 0) return 0;
  // The first byte picks the piece size (1..32), as a network would cut a stream.
  const size_t piece = 1 + data[0] % 32;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  OpenAiStreamReader reader(/*max_event_bytes=*/4096);
  for (size_t at = 0; at < bytes.size(); at += piece) {
    reader.Feed(bytes.substr(at, piece));
    while (true) {
      absl::StatusOr<std::optional<StreamEvent>> event = reader.Next();
      if (!event.ok() && reader.broken()) return 0;
      if (event.ok() && !*event) break;
    }
    if (reader.buffered() > 4096) __builtin_trap();  // the bound holds
  }
  return 0;
}
