// ApiError: the OpenAI error envelope of the HTTP API. A request that fails is an absl::Status
// inside the library, as everywhere in Connex; this file carries the two things the envelope
// needs beyond code and message — the offending field (`param`) and the OpenAI error `code` — as
// status payloads, and maps a status to its HTTP status and envelope
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}.
// Thread-safe (pure functions).
#ifndef CONNEX_SERVING_API_ERROR_H_
#define CONNEX_SERVING_API_ERROR_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace connex::serving {

// InvalidArgument (HTTP 400) naming the field `param` ("" for the request as a whole) and the
// OpenAI `code` (e.g. "invalid_type", "invalid_value", "missing_required_parameter",
// "unsupported_parameter").
absl::Status InvalidRequest(std::string_view param, std::string_view code,
                            std::string_view message);

// NotFound (HTTP 404) with code "model_not_found", param "model".
absl::Status ModelNotFound(std::string_view model);

// Returns `status` with the envelope's `param` and `code` attached (replacing earlier ones).
absl::Status WithApiDetails(absl::Status status, std::string_view param, std::string_view code);

// The `param` / `code` attached to `status`, if any.
std::optional<std::string> ApiParam(const absl::Status& status);
std::optional<std::string> ApiCode(const absl::Status& status);

// The HTTP status of a failed request: InvalidArgument, FailedPrecondition, OutOfRange 400;
// NotFound 404; ResourceExhausted 429; Cancelled 499; Unimplemented 501; Unavailable 503;
// DeadlineExceeded 504; anything else 500.
int HttpStatusOf(const absl::Status& status);

// The OpenAI error `type` for an HTTP status: "invalid_request_error" below 500,
// "server_error" from 500 on.
std::string_view ErrorTypeOf(int http_status);

// The error envelope of `status` (not OK) as compact JSON: message, type, param (null when none),
// code (null when none).
std::string ErrorEnvelope(const absl::Status& status);

// An envelope built directly from its fields (for errors the server decides without a status,
// such as 404 and 405 of the router or 413 of the HTTP layer). Empty `param` / `code` are null.
std::string ErrorEnvelope(int http_status, std::string_view message, std::string_view param,
                          std::string_view code);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_API_ERROR_H_
