// The resume proxy's upstream client (connex/serving/proxy.cc): what one attempt sends a stage-0
// replica — the client's request, or a resume with the prompt's token ids plus those delivered —
// and the attempt itself (UpstreamCall: connect, send, read the streamed answer event by event
// with openai_stream.h's reader, within the connect and idle timeouts). The functions are pure;
// an UpstreamCall is confined to its io_context's thread.
#ifndef CONNEX_SERVING_INTERNAL_UPSTREAM_H_
#define CONNEX_SERVING_INTERNAL_UPSTREAM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "connex/serving/openai_api.h"
#include "connex/serving/openai_stream.h"
#include "connex/serving/proxy.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace connex::serving::internal {

// The body of one upstream attempt: the client's request with the proxy's seed, always streamed
// with usage; a resume (`resume_prompt` not empty) sends the prompt's token ids plus those
// delivered, to /v1/completions, with what is left of max_tokens.
std::string UpstreamBody(const CompletionRequest& r, std::span<const int32_t> resume_prompt,
                         int64_t max_tokens);

// The target and body of the attempt that follows `delivered` tokens of a response to `r`
// (whose prompt's token ids, from its first chunk, are `prompt`): `r` itself when nothing was
// delivered, else a resume — to /v1/completions, whatever `r`'s endpoint. `max_tokens` is what is
// left of r's.
struct UpstreamRequest {
  std::string target;
  std::string body;
};
UpstreamRequest MakeUpstreamRequest(const CompletionRequest& r, std::span<const int32_t> prompt,
                                    std::span<const int32_t> delivered, int64_t max_tokens);

// The message of an OpenAI error envelope, else the body's start.
std::string ErrorMessageOf(const std::string& body);

// An upstream error body (before the stream) or event larger than this is a broken upstream.
inline constexpr size_t kMaxUpstreamMessageBytes = kMaxSseEventBytes;

// One upstream attempt: a POST to a replica's API and its answer, read as it arrives. A 200
// answer is read as a stream of events; any other one whole (at most kMaxUpstreamMessageBytes).
// The callbacks run on the io_context's thread, never after Close; each gets the call.
class UpstreamCall : public std::enable_shared_from_this<UpstreamCall> {
 public:
  using Ptr = std::shared_ptr<UpstreamCall>;
  struct Callbacks {
    std::function<void(const Ptr&)> on_connected;
    // One event of a 200 answer. The call reads on unless the callback closed it.
    std::function<void(const Ptr&, const StreamEvent&)> on_event;
    // The answer's HTTP message ended: a 200 stream (`body` empty; whether [DONE] came is the
    // events'), or another status with its body.
    std::function<void(const Ptr&, int status, std::string body)> on_ended;
    // The attempt failed: `why` names how (no connection, when `connect`; a send or a read that
    // broke; silence past the idle timeout; a malformed or oversized answer).
    std::function<void(const Ptr&, std::string why, bool connect)> on_failed;
  };
  struct Timeouts {
    int64_t connect_ms = 2'000;
    int64_t idle_ms = 30'000;  // no byte for this long: the replica is taken as dead
  };

  static Ptr Create(boost::asio::io_context& io, Replica replica);
  virtual ~UpstreamCall() = default;

  // Sends `request` to the replica's API (Replica::http_address, a numeric HOST:PORT).
  virtual void Start(UpstreamRequest request, Timeouts timeouts, Callbacks callbacks) = 0;
  // Closes the connection (which cancels the request on the replica); no callback runs after it.
  // Idempotent.
  virtual void Close() = 0;
  virtual bool closed() const = 0;
  const Replica& replica() const { return replica_; }

 protected:
  explicit UpstreamCall(Replica replica) : replica_(std::move(replica)) {}

 private:
  const Replica replica_;
};

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_UPSTREAM_H_
