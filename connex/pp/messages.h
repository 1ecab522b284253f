// The step protocol's signals (docs/design/step-protocol.md): small wire frames carried by a
// SignalTransport. Value types; thread-compatible.
#ifndef CONNEX_PP_MESSAGES_H_
#define CONNEX_PP_MESSAGES_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/pp/tensor_dict.h"

namespace connex::pp {

// One stage of a request's path, as the owner resolved it from the directory.
struct Hop {
  Lid lid;
  uint64_t epoch = 0;
  std::string signal;                  // where its signals go
  std::vector<std::string> addresses;  // its transport addresses (for one-sided reads)
  friend bool operator==(const Hop&, const Hop&) = default;
};

// "Pull my payload": sent by the stage that produced a step's tensors to the next stage.
struct StepSignal {
  uint64_t corr = 0;       // correlation id, unique per send
  uint64_t step = 0;       // the owner's step id (the same across attempts)
  uint32_t attempt = 0;    // increases each time the owner re-sends the step
  Hop owner;               // stage 0: results, missing reports and failures go there
  Hop origin;              // the sender: the payload is read from its memory, the ACK goes there
  uint32_t hop = 0;        // index of the target in `route`
  std::vector<Hop> route;  // stages 1..N-1
  std::vector<uint64_t> request_ids;
  std::vector<int32_t> start_positions;
  std::vector<int32_t> num_tokens;
  std::vector<TensorLayout> layout;
  uint64_t remote_addr = 0;  // the payload in the origin's registered memory
  uint64_t length = 0;
  // The owner's incarnation: random per StageNode (a restarted owner draws a new one, a
  // migrated owner keeps it). Stages scope request state by (owner LID, owner_token), and only a
  // RELEASE that carries it is believed.
  uint64_t owner_token = 0;
  // Random per attempt: every answer about this attempt (RESULT, MISSING, HOP_FAILED,
  // STEP_ERROR) must carry it, so an answer that did not see the step is not believed.
  uint64_t ticket = 0;
  const Hop& target() const { return route[hop]; }
};

// The receiver has the payload (code 0), or refuses it (code != 0, e.g. FailedPrecondition for
// a wrong epoch). Either way the sender frees the ring slot.
struct AckSignal {
  uint64_t corr = 0;
  Lid from;
  uint32_t code = 0;
  std::string message;
};

// The last stage's sampled tokens, for the owner.
struct ResultSignal {
  uint64_t step = 0;
  uint32_t attempt = 0;
  Lid from;
  std::vector<uint64_t> request_ids;
  std::vector<int32_t> tokens;
  uint64_t from_epoch = 0;
  uint64_t ticket = 0;  // the step attempt's
};

// A stage does not hold these requests' state: the owner recomputes them.
struct MissingSignal {
  uint64_t step = 0;
  uint32_t attempt = 0;
  Lid from;
  std::vector<uint64_t> request_ids;
  uint64_t from_epoch = 0;
  uint64_t ticket = 0;
};

// A stage could not hand the step to route[hop] (refused, unreachable): the owner re-routes.
struct HopFailedSignal {
  uint64_t step = 0;
  uint32_t attempt = 0;
  Lid from;
  uint32_t hop = 0;
  uint32_t code = 0;
  std::string reason;
  uint64_t from_epoch = 0;
  uint64_t ticket = 0;
};

// A stage's engine failed these requests' step: the owner ends them with this error.
struct StepErrorSignal {
  uint64_t step = 0;
  uint32_t attempt = 0;
  Lid from;
  std::vector<uint64_t> request_ids;
  uint32_t code = 0;
  std::string message;
  uint64_t from_epoch = 0;
  uint64_t ticket = 0;
};

// The owner is done with these requests: drop their state, and answer RELEASED(nonce) at
// `reply_to`. Believed only with the owner's token (StepSignal::owner_token).
struct ReleaseSignal {
  Lid from;
  std::vector<uint64_t> request_ids;
  uint64_t owner_token = 0;
  uint64_t nonce = 0;
  std::string reply_to;
  // Every step of these requests up to this id is over: a late one that arrives after the
  // release is not run (it would make state nobody releases). A later step (a new request
  // under a reused id) is.
  uint64_t upto_step = 0;
};
struct ReleasedSignal {
  uint64_t nonce = 0;
  Lid from;
};

// Liveness probe after a step timeout, and its answer.
struct PingSignal {
  uint64_t nonce = 0;
  Lid from;
  std::string reply_to;
};
struct PongSignal {
  uint64_t nonce = 0;
  Lid from;
  uint64_t epoch = 0;
};

using Signal = std::variant<StepSignal, AckSignal, ResultSignal, MissingSignal, HopFailedSignal,
                            StepErrorSignal, ReleaseSignal, ReleasedSignal, PingSignal, PongSignal>;

std::string Encode(const Signal& signal);
// InvalidArgument names the field that is wrong.
absl::StatusOr<Signal> Decode(std::string_view frame);

}  // namespace connex::pp

#endif  // CONNEX_PP_MESSAGES_H_
