// Stop strings: where a `stop` string ends a completion, and how much of the text generated so
// far is safe to stream. A stop string may arrive split over several tokens, so the suffix that
// could still grow into one is held back until the next tokens decide; the output never contains
// the stop string (as in OpenAI). Text is also held back while it ends inside a UTF-8 sequence
// (the byte-level tokenizer produces one byte per token), so a streamed chunk is never cut in the
// middle of a character. Thread-compatible.
#ifndef CONNEX_SERVING_STOP_STRINGS_H_
#define CONNEX_SERVING_STOP_STRINGS_H_

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace connex::serving {

struct StopScan {
  // The start of the earliest stop string in the text: the output ends there.
  std::optional<size_t> stop_at;
  // Without a match: the length of the prefix that no continuation can make part of a stop
  // string, and that does not end inside a UTF-8 sequence. With a match: `*stop_at`.
  size_t safe_length = 0;
};

// Scans `text` for `stops`, looking for matches that start at `from` or later (the caller has
// already streamed text before `from`, which ScanForStop found safe).
StopScan ScanForStop(std::string_view text, std::span<const std::string> stops, size_t from = 0);

// The length of the longest prefix of `text` that does not end inside a UTF-8 sequence (an
// invalid byte counts as complete, so malformed text is never held back for ever).
size_t CompleteUtf8Prefix(std::string_view text);

// The streaming form: feeds generated text in, hands out what may be sent.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);

  // Adds newly generated text and returns the part of the output that became safe to send (may
  // be empty). When a stop string completes, returns the text before it and stopped() turns
  // true; text appended afterwards is ignored.
  std::string Append(std::string_view text);

  // Generation ended for another reason (length, EOS): returns the text still held back.
  std::string Finish();

  bool stopped() const { return stopped_; }
  // Everything handed out so far.
  std::string_view output() const { return std::string_view(text_).substr(0, sent_); }

 private:
  std::vector<std::string> stops_;
  std::string text_;  // generated text (cut at the stop string once one matched)
  size_t sent_ = 0;   // bytes of text_ handed out
  bool stopped_ = false;
};

}  // namespace connex::serving

#endif  // CONNEX_SERVING_STOP_STRINGS_H_
