#include "connex/serving/stop_strings.h"

#include <algorithm>
#include <utility>

namespace connex::serving {

size_t CompleteUtf8Prefix(std::string_view text) {
  // Look at most 3 bytes back for the lead byte of the last sequence.
  size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < need ? n - back : n;
  }
  return n;  // only continuation bytes at the end: malformed, nothing to wait for
}

StopScan ScanForStop(std::string_view text, std::span<const std::string> stops, size_t from) {
  StopScan scan;
  for (const std::string& stop : stops) {
    size_t at = text.find(stop, from);
    if (at != std::string_view::npos && (!scan.stop_at || at < *scan.stop_at)) scan.stop_at = at;
  }
  if (scan.stop_at) {
    scan.safe_length = *scan.stop_at;
    return scan;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t held = 0;
  for (const std::string& stop : stops) {
    size_t longest = std::min(stop.size() - 1, text.size());
    for (size_t len = longest; len > held; --len) {
      if (text.substr(text.size() - len) == std::string_view(stop).substr(0, len)) {
        held = len;
        break;
      }
    }
  }
  scan.safe_length = CompleteUtf8Prefix(text.substr(0, text.size() - held));
  return scan;
}

StopStringFilter::StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopStringFilter::Append(std::string_view text) {
  if (stopped_) return {};
  text_.append(text);
  StopScan scan = ScanForStop(text_, stops_, sent_);
  if (scan.stop_at) {
    stopped_ = true;
    text_.resize(*scan.stop_at);
  }
  size_t safe = std::max(scan.safe_length, sent_);
  std::string out = text_.substr(sent_, safe - sent_);
  sent_ = safe;
  return out;
}

std::string StopStringFilter::Finish() {
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace connex::serving
