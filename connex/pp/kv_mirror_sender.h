// MirrorSender: the primary's side of the KV standby (docs/design/step-protocol.md, "KV
// standby"). After each step a stage ran, the state it appended (Engine::ExportState) goes to its
// standby — the same stage of the replica after it, chosen by the node from the directory — off
// the critical path: packed into a slot of a small ring of registered memory of its own and
// announced with MIRROR; the standby pulls it with a one-sided read and answers MIRRORED with
// what it holds. A request has at most one update in flight; what did not fit (no free slot, a
// lost or refused update, a new standby) is sent with the next one, from what the standby
// confirmed. A standby is never waited for: a full ring only delays the mirrors.
// Thread-compatible: owned by a StageNode's loop thread.
#ifndef CONNEX_PP_KV_MIRROR_SENDER_H_
#define CONNEX_PP_KV_MIRROR_SENDER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "connex/base/clock.h"
#include "connex/base/lid.h"
#include "connex/pp/engine.h"
#include "connex/pp/messages.h"
#include "connex/pp/request_scope.h"
#include "connex/pp/send_ring.h"

namespace connex::pp {

// The standby's lag when a request's step runs on the primary: positions the standby did not
// confirm yet, in buckets 0, 1, 2, 3-4, 5-8, 9-16, 17+ (a decode step is one position).
inline constexpr size_t kLagBuckets = 7;
size_t LagBucket(int64_t lag);
// The bucket's label: "0", "1", "2", "3-4", "5-8", "9-16", "17+".
const char* LagBucketName(size_t bucket);

struct MirrorSenderOptions {
  int64_t ack_timeout_ms = 5000;  // an update not answered this long is sent again
  int64_t interval_ms = 0;        // at most one round of updates per interval (0: every turn)
  Clock* clock = nullptr;         // nullptr: the real clock
  uint64_t first_corr = 1;
  std::string what = "KV standby";  // its log lines' name for the standby
};

struct MirrorSenderStats {
  uint64_t updates_sent = 0;
  uint64_t bytes_sent = 0;       // payload bytes mirrored
  uint64_t refused = 0;          // updates the standby refused (whole)
  uint64_t expired = 0;          // updates not answered in time
  uint64_t stopped = 0;          // requests the standby dropped for its budget
  uint64_t standby_changes = 0;  // a standby picked (the first one too), replaced or lost
  uint64_t export_errors = 0;    // ExportState failed (the request is not mirrored)
  std::array<uint64_t, kLagBuckets> lag{};  // see LagBucket
  size_t tracked = 0;                       // requests held here
};

class MirrorSender {
 public:
  using SendSignal = std::function<void(const std::string& address, const Signal& signal)>;
  using Self = std::function<Hop()>;

  // `ring` is the mirrors' own registered memory; `engine` exports the state.
  MirrorSender(MirrorSenderOptions options, std::unique_ptr<SendRing> ring, Engine& engine,
               Self self, SendSignal send);

  // The standby now (nullopt: none). Another one starts every request's mirror from 0.
  void SetStandby(const std::optional<Hop>& standby);
  const std::optional<Hop>& standby() const { return standby_; }

  // The owner's request `id` (engine id `local` here) ran a step from `start`: its state here
  // now covers positions [0, positions).
  void Ran(const Hop& owner, uint64_t owner_token, uint64_t id, uint64_t local, int64_t start,
           int64_t positions);
  // The state of these requests here went (released): their mirrors go too.
  void Forget(const OwnerKey& owner, const std::vector<uint64_t>& ids);
  // The owner incarnations of `lid` up to `epoch` are gone (the standby drops their mirrors
  // itself).
  void ForgetOwner(const Lid& lid, uint64_t epoch);

  // Sends the updates due while slots are free.
  void Flush();
  // The standby's answer (false: not from the standby the update went to; dropped).
  bool OnMirrored(const MirroredSignal& m);
  // Gives up updates not answered in time (they are sent again).
  void Expire(int64_t now_ms);
  int64_t NextDeadline(int64_t otherwise) const;
  // Updates sent and not answered yet.
  size_t in_flight() const { return outgoing_.size(); }
  // Whether the update `corr` was sent by this sender and is not answered yet.
  bool Awaits(uint64_t corr) const { return outgoing_.count(corr) > 0; }
  // Positions of the owner's request `id` the standby confirmed; -1 when it dropped the
  // request for its budget; nullopt when the request is not tracked here.
  std::optional<int64_t> Confirmed(const OwnerKey& owner, uint64_t id) const;

  const MirrorSenderStats& stats() const { return stats_; }

 private:
  using Key = std::pair<OwnerKey, uint64_t>;
  struct Track {
    Hop owner;
    uint64_t local = 0;
    int64_t positions = 0;   // held here
    int64_t mirrored = 0;    // confirmed by the standby
    uint64_t in_flight = 0;  // the corr of the update in flight, 0: none
    bool stopped = false;    // the standby dropped it for its budget
  };
  struct Outgoing {
    Lid target;
    int64_t deadline = 0;
    std::vector<Key> keys;
  };
  void Free(uint64_t corr);
  // Packs the updates of `keys` (one owner) that fit a slot, and sends them.
  bool SendUpdate(const std::vector<Key>& keys);
  int64_t NowMs() const { return clock_->NowMs(); }

  const MirrorSenderOptions o_;
  Clock* const clock_;
  std::unique_ptr<SendRing> ring_;
  Engine& engine_;
  Self self_;
  SendSignal send_;
  uint64_t next_corr_;
  std::optional<Hop> standby_;
  int64_t last_flush_ms_ = 0;
  std::map<Key, Track> tracks_;
  std::map<uint64_t, Outgoing> outgoing_;
  MirrorSenderStats stats_;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_KV_MIRROR_SENDER_H_
