#include "connex/serving/api_error.h"

#include <utility>

#include "absl/strings/cord.h"
#include "connex/base/json_text.h"
#include "connex/base/strings.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

constexpr char kParamUrl[] = "connex.serving/param";
constexpr char kCodeUrl[] = "connex.serving/code";

std::optional<std::string> Payload(const absl::Status& status, const char* url) {
  auto payload = status.GetPayload(url);  // absl::optional in Debian's abseil
  if (!payload) return std::nullopt;
  return std::string(*payload);
}

nlohmann::json NullIfEmpty(std::string_view s) {
  if (s.empty()) return nullptr;
  return std::string(s);
}

}  // namespace

absl::Status WithApiDetails(absl::Status status, std::string_view param, std::string_view code) {
  status.SetPayload(kParamUrl, absl::Cord(AsAbsl(param)));
  status.SetPayload(kCodeUrl, absl::Cord(AsAbsl(code)));
  return status;
}

absl::Status InvalidRequest(std::string_view param, std::string_view code,
                            std::string_view message) {
  return WithApiDetails(absl::InvalidArgumentError(AsAbsl(message)), param, code);
}

absl::Status ModelNotFound(std::string_view model) {
  return WithApiDetails(
      absl::NotFoundError(AsAbsl(StrCat("The model '", model, "' does not exist"))), "model",
      "model_not_found");
}

std::optional<std::string> ApiParam(const absl::Status& status) {
  return Payload(status, kParamUrl);
}

std::optional<std::string> ApiCode(const absl::Status& status) { return Payload(status, kCodeUrl); }

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string_view ErrorTypeOf(int http_status) {
  return http_status < 500 ? "invalid_request_error" : "server_error";
}

std::string ErrorEnvelope(int http_status, std::string_view message, std::string_view param,
                          std::string_view code) {
  nlohmann::json error = {{"message", std::string(message)},
                          {"type", std::string(ErrorTypeOf(http_status))},
                          {"param", NullIfEmpty(param)},
                          {"code", NullIfEmpty(code)}};
  return DumpJson(nlohmann::json{{"error", std::move(error)}});
}

std::string ErrorEnvelope(const absl::Status& status) {
  return ErrorEnvelope(HttpStatusOf(status), AsStd(status.message()), ApiParam(status).value_or(""),
                       ApiCode(status).value_or(""));
}

}  // namespace connex::serving
