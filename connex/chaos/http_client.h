// The HTTP side of connex-chaos: the serving stack's API asked over serving's blocking client
// (connex/serving/http_client.h): GET, and streamed /v1/completions with the arrival time of
// every token. Every call ends by its deadline. Thread-safe (each call has its own connection).
#ifndef CONNEX_CHAOS_HTTP_CLIENT_H_
#define CONNEX_CHAOS_HTTP_CLIENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/serving/http_client.h"

namespace connex::chaos {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};
// "HOST:PORT"; InvalidArgument naming `what` otherwise.
absl::StatusOr<HostPort> ParseHostPort(std::string_view what, std::string_view text);

using serving::HttpReply;
absl::StatusOr<HttpReply> HttpGet(const HostPort& at, const std::string& target,
                                  int64_t timeout_ms);

// One streamed completion as a client saw it.
struct StreamResult {
  int http_status = 0;  // 0: no response head
  // Empty when the stream ended as it should (a finish_reason, then [DONE]); otherwise what
  // went wrong (connection, timeout, an error event, a non-200 answer).
  std::string error;
  std::vector<int32_t> tokens;    // the generated token ids, in order
  std::vector<int64_t> token_ns;  // when each arrived (steady clock = CLOCK_MONOTONIC, ns)
  std::string finish_reason;
  std::string text;                       // the choices' text, concatenated
  std::vector<std::string> response_ids;  // the distinct "id"s of its chunks (one expected)
  // The usage chunk's counts; -1 when none came.
  int64_t prompt_tokens = -1, completion_tokens = -1, total_tokens = -1;
  // Through connex-proxy: the stage-0 replica the answer began on (its X-Connex-Replica header,
  // "model/g0/s0/r1@7"); empty from a stage 0 itself.
  std::string began_on;
  std::string retry_after;  // the Retry-After header of a refusal (429, 503)
  int64_t start_ns = 0;     // request about to be sent
  int64_t end_ns = 0;       // stream over
  bool ok() const { return error.empty(); }
};

// POSTs `body` (a JSON completion request with "stream": true) to /v1/completions at `at`.
// Gives up when nothing arrives for `idle_timeout_ms` or the whole takes `total_timeout_ms`.
// `on_token` (if set) runs on the calling thread as each token arrives, with its arrival time
// (the one in `token_ns`).
StreamResult StreamCompletion(
    const HostPort& at, const std::string& body, int64_t idle_timeout_ms, int64_t total_timeout_ms,
    const std::function<void(int32_t token, int64_t at_ns)>& on_token = nullptr);

// Steady-clock now in ns (the clock of StreamResult and of the stages' per-epoch metrics).
int64_t MonotonicNowNs();

}  // namespace connex::chaos

#endif  // CONNEX_CHAOS_HTTP_CLIENT_H_
