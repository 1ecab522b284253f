// Field readers shared by the tokenizer.json component factories; errors name `where` and the
// field. Thread-safe (pure functions).
#ifndef CONNEX_ENGINE_INTERNAL_HF_JSON_H_
#define CONNEX_ENGINE_INTERNAL_HF_JSON_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "connex/engine/internal/hf_regex.h"
#include "nlohmann/json_fwd.hpp"

namespace connex::engine::internal {

// InvalidArgument "<where>: <what> is not supported".
absl::Status Unsupported(const std::string& where, std::string_view what);
absl::StatusOr<std::string> StringField(const nlohmann::json& j, const std::string& where,
                                        const char* field);
bool BoolField(const nlohmann::json& j, const char* field, bool fallback);
int IntField(const nlohmann::json& j, const char* field, int fallback);
// The `{"String": ...}` or `{"Regex": ...}` object in field "pattern".
absl::StatusOr<Regex> MakePattern(const nlohmann::json& j, const std::string& where);

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_HF_JSON_H_
