// GroupView: the membership rules of one group of endpoints as a sender sees them — which
// incarnations (LID, epoch) are live, draining (LEFT) or failed, how a transport event's address
// maps to an incarnation, and the sticky replica pick. A state machine with no I/O and no
// threads, driven by ElasticPeerSet and tested alone (as directory/registry.h is).
//
// Thread-compatible: the owner (ElasticPeerSet) guards it with its lock.
#ifndef CONNEX_ELASTIC_GROUP_VIEW_H_
#define CONNEX_ELASTIC_GROUP_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "connex/base/lid.h"
#include "connex/directory/protocol.h"

namespace connex::elastic {

// What became of a peer, as a change callback sees it.
struct PeerChange {
  enum class Kind { kJoined, kLeft, kFailed, kMigrated, kSuspected };
  Kind kind = Kind::kJoined;
  directory::Record record;     // the incarnation the change is about
  uint64_t previous_epoch = 0;  // kMigrated
  // A local decision of this sender (MarkFailed, a transport event), not a directory event.
  bool local = false;
  std::string reason;  // e.g. "transport: mem: engine destroyed", "directory: FAILED reported"
};
std::string_view PeerChangeKindName(PeerChange::Kind kind);

enum class PeerState {
  kLive,      // may be picked for new work
  kDraining,  // LEFT gracefully: no new work, in-flight work finishes
  kFailed,    // evicted (directory FAILED, MarkFailed, transport death): in-flight work is lost
  kUnknown,   // not a member this view knows (never seen, superseded, or forgotten)
};
std::string_view PeerStateName(PeerState state);

struct PeerInfo {
  directory::Record record;
  PeerState state = PeerState::kUnknown;
  bool suspected = false;  // the transport reported kSuspected since the last kConnected
  std::string reason;      // why it is draining or failed
};

struct GroupViewOptions {
  std::string model;
  uint32_t group = 0;
  // Only this shard's records are members; nullopt: every shard of the group.
  std::optional<uint32_t> shard = std::nullopt;
  // The caller's own replica index: the pick prefers it.
  uint32_t own_replica = 0;
  // Only records that publish an address starting with this are members (the step protocol
  // needs its "pp+" signal address); empty: every record.
  std::string member_address_prefix = "";
  // At most this many draining and failed incarnations are remembered (to answer StateOf and to
  // ignore a lagging directory's stale records); the oldest are forgotten first, and a newer
  // epoch of a LID supersedes what is remembered of it.
  size_t max_remembered = 1024;
};

class GroupView {
 public:
  explicit GroupView(GroupViewOptions options);

  // Whether `record` belongs to this group (model, group, shard, address prefix).
  bool IsMember(const directory::Record& record) const;

  // Applies a record of a directory snapshot (the initial view) as a JOINED. Returns the change
  // to announce, if any.
  std::optional<PeerChange> ApplyRecord(const directory::Record& record);
  // Applies a directory event. Returns the change to announce, if any.
  std::optional<PeerChange> Apply(const directory::Event& event);

  // Evicts (lid, epoch) locally (epoch 0: the live incarnation of `lid`). A live or draining
  // incarnation becomes failed. Returns the change (local) or nullopt when that incarnation is
  // neither live nor draining here.
  std::optional<PeerChange> Evict(const Lid& lid, uint64_t epoch, std::string reason);

  // The incarnation of `lid` that a transport connection to `address` belongs to: the live or
  // draining one that publishes that address (an empty address: the newest of them). Nullopt
  // when none does — e.g. a late event about a restarted endpoint's previous process, which
  // must not condemn the new incarnation.
  std::optional<uint64_t> EpochOfAddress(const Lid& lid, std::string_view address) const;

  // Records a transport suspicion of live (lid, epoch); returns the change the first time.
  std::optional<PeerChange> Suspect(const Lid& lid, uint64_t epoch, std::string reason);
  // Clears a suspicion (the transport reconnected).
  void ClearSuspicion(const Lid& lid, uint64_t epoch);

  // The sticky pick: `current` if it is still live, else the live peer of the own replica, else
  // the first live replica after it (wrapping around). Null when no peer is live.
  const directory::Record* Pick(const Lid* current) const;

  bool IsUsable(const Lid& lid, uint64_t epoch) const;
  PeerState StateOf(const Lid& lid, uint64_t epoch) const;
  // The live incarnation of `lid`.
  const directory::Record* Live(const Lid& lid) const;

  std::vector<directory::Record> LiveRecords() const;  // sorted by LID
  std::vector<PeerInfo> Members() const;  // live, then draining and failed, sorted by LID
  size_t live_count() const { return live_.size(); }
  size_t remembered_count() const { return gone_.size(); }

 private:
  using Key = std::pair<Lid, uint64_t>;
  struct LiveEntry {
    directory::Record record;
    bool suspected = false;
  };

  // Remembers (lid, epoch) as draining or failed, forgetting the oldest beyond the bound.
  void Remember(const directory::Record& record, PeerState state, std::string reason);
  void Forget(const Key& key);
  // Forgets every remembered incarnation of `lid` older than `epoch` (the directory superseded
  // them).
  void ForgetOlder(const Lid& lid, uint64_t epoch);

  const GroupViewOptions options_;
  std::map<Lid, LiveEntry> live_;  // one live incarnation per LID
  std::map<Key, PeerInfo> gone_;
  std::deque<Key> gone_order_;  // oldest first; same keys as gone_
};

}  // namespace connex::elastic

#endif  // CONNEX_ELASTIC_GROUP_VIEW_H_
