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
  // Whether it names no hop (an empty LID: an optional hop not given).
  bool none() const { return lid.model.empty(); }
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
  // Requests (owner ids) whose state every stage cuts back to the step's start position before
  // it runs: the owner recomputes what a standby lacked (KV standby). Empty: none.
  std::vector<uint64_t> rewind;
  // Prefill-decode disaggregation (docs/design/pd.md): the decode instance the target (a
  // prefill instance) hands the step's requests' state to; an empty LID (model "") when none.
  Hop handoff;
  bool has_handoff() const { return !handoff.none(); }
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

// A stage does not hold these requests' state at the step's start: the owner recomputes them.
struct MissingSignal {
  uint64_t step = 0;
  uint32_t attempt = 0;
  Lid from;
  std::vector<uint64_t> request_ids;
  uint64_t from_epoch = 0;
  uint64_t ticket = 0;
  // Empty, or for each request the positions the stage does hold (a standby's mirror that
  // lags): the owner recomputes from there instead of from 0.
  std::vector<int32_t> held;
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

// KV standby (docs/design/step-protocol.md, "KV standby"): a stage's state appended since its
// last MIRROR, for its standby (the same stage of another replica) to pull from the primary's
// registered memory with one one-sided read, as a step is pulled.
struct MirrorSignal {
  uint64_t corr = 0;
  Hop origin;  // the primary: the payload is read from its memory, MIRRORED goes back there
  Lid target;  // the standby, and the epoch the primary saw it at (fencing)
  uint64_t target_epoch = 0;
  Hop owner;  // the requests' owner (lid and epoch; the signal address is not used)
  uint64_t owner_token = 0;
  std::vector<uint64_t> request_ids;  // the owner's ids
  std::vector<int32_t> from;          // each request's positions [from, to) in this update
  std::vector<int32_t> to;
  // Request i's tensors are named "<i>/<the engine's key>".
  std::vector<TensorLayout> layout;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
};
// The standby's answer: the slot is free. code 0: `held[i]` positions of request i are
// mirrored now (-1: the mirror was dropped, send no more of it); else the whole update was
// refused (a wrong epoch, a failed read: `message`).
struct MirroredSignal {
  uint64_t corr = 0;
  Lid from;
  uint32_t code = 0;
  std::string message;
  std::vector<uint64_t> request_ids;
  std::vector<int64_t> held;
};
// The primary dropped these requests' state (released, or their owner is gone): the standby
// drops their mirrors.
struct MirrorDropSignal {
  Lid from;
  uint64_t from_epoch = 0;
  Lid owner;
  uint64_t owner_token = 0;
  std::vector<uint64_t> request_ids;
};

using Signal = std::variant<StepSignal, AckSignal, ResultSignal, MissingSignal, HopFailedSignal,
                            StepErrorSignal, ReleaseSignal, ReleasedSignal, PingSignal, PongSignal,
                            MirrorSignal, MirroredSignal, MirrorDropSignal>;

std::string Encode(const Signal& signal);
// InvalidArgument names the field that is wrong.
absl::StatusOr<Signal> Decode(std::string_view frame);

}  // namespace connex::pp

#endif  // CONNEX_PP_MESSAGES_H_
