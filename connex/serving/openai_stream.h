// The streamed form of the OpenAI-compatible API, both ways, in one place: the writer
// (ChunkBuilder: `text_completion` / `chat.completion.chunk` chunks, the usage chunk, the
// in-stream error event, `data: [DONE]`, each framed as a server-sent event) that stage 0 and the
// resume proxy answer with, and the reader (SseReader, ParseStreamEvent, OpenAiStreamReader:
// bytes in as they arrive, events out) that the proxy reads its upstream with and connex-chaos
// its answers. Beyond OpenAI's fields every chunk carries `token_ids` and the first one
// `prompt_token_ids` (docs/serving.md, "Responses"). Thread-compatible (every class); the free
// functions are thread-safe.
#ifndef CONNEX_SERVING_OPENAI_STREAM_H_
#define CONNEX_SERVING_OPENAI_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/serving/openai_response.h"

namespace connex::serving {

// ---- Writing ----

// `data: <json>\n\n` (json must be one line, as every builder here makes it).
std::string SseEvent(std::string_view json);
// The stream's terminator, `data: [DONE]\n\n`.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// A comment, which readers skip: what a stream sends while it waits
// (HttpExchange::KeepStreamAlive).
inline constexpr std::string_view kSseKeepAlive = ": keep-alive\n\n";

// The chunks of one streamed response, each already framed as an SSE event.
class ChunkBuilder {
 public:
  // `include_usage`: stream_options.include_usage — every chunk carries "usage": null and
  // the stream's data ends with the usage chunk (End).
  ChunkBuilder(ResponseHeader header, bool include_usage);

  // A chunk of generated text with its tokens; `finish` on the last one. The first chunk also
  // carries `prompt_token_ids` (and, for chat, the delta's role "assistant"); later ones ignore
  // `prompt_token_ids`, so a caller may pass the prompt every time.
  std::string Delta(std::string_view text, std::span<const int32_t> token_ids,
                    std::span<const int32_t> prompt_token_ids,
                    std::optional<FinishReason> finish = std::nullopt);

  // The usage chunk, `choices: []`.
  std::string UsageChunk(const Usage& usage) const;

  // What follows the chunk with the finish reason: the usage chunk (with include_usage), then
  // kSseDone.
  std::string End(const Usage& usage) const;

  // An error after the stream started: one more event with the error envelope. The stream then
  // ends with kSseDone (ErrorEnd has both).
  static std::string ErrorEvent(const absl::Status& status);
  static std::string ErrorEnd(const absl::Status& status);
  // The same for an envelope received as JSON (a replica's): the envelope when it is a JSON
  // object, else an Internal error quoting it.
  static std::string ErrorEnd(std::string_view envelope_json);

  bool started() const { return !first_; }  // a Delta was made

 private:
  ResponseHeader header_;
  bool include_usage_;
  bool first_ = true;
};

// ---- Reading ----

// A server-sent event (or a line) larger than this ends the reading: a broken peer.
inline constexpr size_t kMaxSseEventBytes = size_t{1} << 20;

// The server-sent events of a byte stream, read incrementally: Feed the bytes as they arrive (an
// event or a line may be split anywhere, several may come at once), take each complete event's
// data with Next. As the SSE specification has it: a line ends with "\n" (a "\r" before it is
// dropped), an event with an empty line; a comment (":...") and the fields other than `data`
// (`event`, `id`, `retry`, unknown ones) are skipped; an event's `data` lines are joined with
// "\n"; an event without a `data` line is not one. Thread-compatible.
class SseReader {
 public:
  explicit SseReader(size_t max_event_bytes = kMaxSseEventBytes);

  void Feed(std::string_view bytes);
  // The data of the next complete event; nullopt until one has arrived whole. DataLoss (and for
  // good: the stream cannot be resynchronised) when an event grows past max_event_bytes.
  absl::StatusOr<std::optional<std::string>> Next();

  size_t buffered() const { return buffer_.size() - scan_ + data_.size(); }
  bool broken() const { return !status_.ok(); }  // an event was over the bound

 private:
  const size_t max_event_bytes_;
  std::string buffer_;  // bytes fed; [0, scan_) are taken
  size_t scan_ = 0;     // the start of the first line not yet taken
  std::string data_;    // the current event's data lines so far
  bool has_data_ = false;
  absl::Status status_;  // the error that ended the reading
};

// One event of an OpenAI stream (stage 0's or the proxy's answer), parsed.
struct StreamEvent {
  enum class Kind { kChunk, kUsage, kDone, kError } kind = Kind::kChunk;
  std::string id;  // the response id of a chunk or usage chunk
  // kChunk (choices[0]): its text (a completion's `text`, a chat delta's `content`), tokens.
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> prompt_token_ids;
  std::optional<FinishReason> finish;
  // A `usage` object (the usage chunk's): the counts as sent, -1 where absent.
  int64_t prompt_tokens = -1, completion_tokens = -1, total_tokens = -1;
  // kError: the envelope as sent, its message, and whether it is the server's fault
  // (`server_error`: worth a retry elsewhere).
  std::string error_json;
  std::string error_message;
  bool server_error = false;
};

// `data` is one event's data (what follows "data: "). DataLoss naming what is wrong: not JSON,
// no `choices`, a choice that is not an object, a finish_reason other than stop or length.
absl::StatusOr<StreamEvent> ParseStreamEvent(std::string_view data);

// SseReader and ParseStreamEvent together: bytes in, OpenAI stream events out.
class OpenAiStreamReader {
 public:
  explicit OpenAiStreamReader(size_t max_event_bytes = kMaxSseEventBytes) : sse_(max_event_bytes) {}

  void Feed(std::string_view bytes) { sse_.Feed(bytes); }
  // The next complete event; nullopt until one has arrived whole. DataLoss naming the event (its
  // number in the stream) when it does not parse — the reader goes on with the next one — or,
  // for good, when one is over the size bound.
  absl::StatusOr<std::optional<StreamEvent>> Next();

  bool done() const { return done_; }            // [DONE] was read
  bool broken() const { return sse_.broken(); }  // an event was over the bound: no more events
  int64_t events() const { return events_; }
  size_t buffered() const { return sse_.buffered(); }

 private:
  SseReader sse_;
  int64_t events_ = 0;
  bool done_ = false;
};

}  // namespace connex::serving

#endif  // CONNEX_SERVING_OPENAI_STREAM_H_
