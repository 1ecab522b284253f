// ReleaseQueue: the owner's side of releasing finished requests' state on the stages they
// visited. Requests are batched per stage, sent as one RELEASE (with the owner's token and the
// last step id it covers), and re-sent with backoff until the stage answers RELEASED — at most
// `max_attempts` times: a stage that never answers is gone (its state went with it) or
// unreachable, and drops the owner's requests when it sees the owner FAILED or LEFT.
// Thread-compatible: owned by a StageNode's loop thread.
#ifndef CONNEX_PP_RELEASE_QUEUE_H_
#define CONNEX_PP_RELEASE_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "connex/base/lid.h"
#include "connex/pp/messages.h"

namespace connex::pp {

struct ReleaseQueueOptions {
  Lid owner;                 // this owner
  uint64_t owner_token = 0;  // its incarnation
  int max_attempts = 10;
  int64_t max_backoff_ms = 5000;  // retries back off from 100 ms up to this
  uint64_t first_nonce = 1;
};

class ReleaseQueue {
 public:
  // Where a stage's signals go now, if it is live (nullopt: use the address last seen).
  using CurrentAddress = std::function<std::optional<std::string>(const Lid& stage)>;
  using SendSignal = std::function<void(const std::string& address, const Signal& signal)>;

  ReleaseQueue(ReleaseQueueOptions options, CurrentAddress current, SendSignal send);

  // Request `id` ended: release it on each of `stages` (LID -> the signal address last seen).
  void Add(uint64_t id, const std::map<Lid, std::string>& stages);
  // Sends what was added since (one RELEASE per stage, covering steps up to `upto_step`) and
  // re-sends what is due; `reply_to` is the owner's signal address.
  void Flush(int64_t now_ms, uint64_t upto_step, const std::string& reply_to);
  // A stage's answer. False when no RELEASE of that nonce went to `from` (ignored).
  bool OnReleased(const ReleasedSignal& released);

  // Requests not yet acknowledged, counted once per stage.
  size_t pending() const;

 private:
  struct InFlight {
    Lid stage;
    std::string address;
    std::vector<uint64_t> ids;
    uint64_t upto_step = 0;
    int attempts = 0;
    int64_t next_at = 0;
  };
  const ReleaseQueueOptions o_;
  CurrentAddress current_;
  SendSignal send_;
  uint64_t next_nonce_;
  std::map<Lid, std::pair<std::string, std::set<uint64_t>>> unsent_;
  std::map<uint64_t, InFlight> in_flight_;  // nonce ->
};

}  // namespace connex::pp

#endif  // CONNEX_PP_RELEASE_QUEUE_H_
