// JSON text in and out, compiled once. Every translation unit that calls nlohmann's
// `json::parse` or `dump` instantiates its parser or serializer at -O2 (about 2.2 CPU s of g++
// a unit, for each of json and ordered_json; docs/development.md, "What a build pays for"):
// the code calls these instead (the connex_json target), which no bad input makes throw.
#ifndef CONNEX_BASE_JSON_TEXT_H_
#define CONNEX_BASE_JSON_TEXT_H_

#include <limits>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace connex {

// `text` parsed; a discarded value (`is_discarded()`) when it is not one whole JSON value.
nlohmann::json ParseJson(std::string_view text);
nlohmann::ordered_json ParseOrderedJson(std::string_view text);

// `text` parsed, or why not: OutOfRange when arrays and objects nest deeper than `max_depth`
// (the parser stops at the first such level: a body of 100,000 '[' costs no stack),
// InvalidArgument with nlohmann's message (where and what) when it is not JSON.
absl::StatusOr<nlohmann::json> ParseJsonChecked(std::string_view text,
                                                int max_depth = std::numeric_limits<int>::max());

// `value` as text: compact (indent -1) or indented by `indent` spaces; a string that is not
// valid UTF-8 has its bad bytes replaced by U+FFFD (nlohmann's strict dump would throw).
std::string DumpJson(const nlohmann::json& value, int indent = -1);
std::string DumpJson(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace connex

#endif  // CONNEX_BASE_JSON_TEXT_H_
