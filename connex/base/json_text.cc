#include "connex/base/json_text.h"

#include "connex/base/strings.h"
#include "nlohmann/json.hpp"

namespace connex {

nlohmann::json ParseJson(std::string_view text) {
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

nlohmann::ordered_json ParseOrderedJson(std::string_view text) {
  return nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr,
                                       /*allow_exceptions=*/false);
}

namespace {
struct TooDeep {};
}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonChecked(std::string_view text, int max_depth) {
  auto depth_guard = [max_depth](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > max_depth) throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), depth_guard);
  } catch (const TooDeep&) {
    return absl::OutOfRangeError(StrCat("it nests deeper than ", max_depth, " levels"));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

std::string DumpJson(const nlohmann::json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string DumpJson(const nlohmann::ordered_json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace connex
