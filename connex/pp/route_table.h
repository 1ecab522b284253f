// RouteTable: a node's peer sets, one per stage it deals with (elastic::ElasticPeerSet is the
// one place that knows a stage's live, draining and failed members), and what the step protocol
// asks of them: the owner's sticky route through stages 1..N-1, whether a hop of a route is
// still usable, where a stage's live incarnation is reached now, why no route can be built, and
// the eviction of a failed incarnation. Nothing here keeps membership of its own.
// Thread-compatible: owned by a StageNode's loop thread (the peer sets are thread-safe).
#ifndef CONNEX_PP_ROUTE_TABLE_H_
#define CONNEX_PP_ROUTE_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "connex/base/lid.h"
#include "connex/directory/protocol.h"
#include "connex/elastic/peer_set.h"
#include "connex/pp/messages.h"
#include "connex/pp/pd.h"
#include "connex/pp/signal_transport.h"

namespace connex::pp {

// The hop of a directory record: its LID and epoch, its signal address (kSignalScheme) and its
// transport addresses (the zmq+ message channel of the peer set is not one of them).
Hop HopFromRecord(const directory::Record& record);

// A route's identity, LIDs and epochs: steps on one route are counted together (K in flight).
std::string RouteKey(const std::vector<Hop>& route);

// Whether stage `stage` exchanges steps with stage `group` (another one): the owner (stage 0)
// with every later stage, a later stage with the owners and the next stage.
bool DealsWith(uint32_t stage, uint32_t group);

// The replica of a stage that `replica`'s KV standby is: the first live one after it in replica
// order, wrapping around (never `replica` itself); nullopt when there is none. `live` are the
// stage's live records.
std::optional<directory::Record> NextReplicaAfter(const std::vector<directory::Record>& live,
                                                  uint32_t replica);

class RouteTable {
 public:
  explicit RouteTable(uint32_t stages) : peers_(stages) {}

  // KV standby (kv_standby.h): Watch follows this node's own stage too (a later stage: its
  // standby and the primaries it is the standby of), and Build replaces a dead hop by its
  // standby (NextReplicaAfter), where its requests' state is mirrored.
  void SetKvStandby(bool on) { kv_standby_ = on; }
  // Prefill-decode disaggregation (pd.h): the table has the PD deployment's three groups; a
  // route is one hop, of the prefill or the decode pool (PdHop), and Build keeps a hop in its
  // pool. Watch follows the groups `role` deals with: a frontend both pools (through the
  // transport: a dead instance is a failover), an instance the frontends and the other pool (a
  // decode instance takes mirrors from prefill members; a prefill instance hands state to decode
  // members), through the directory alone.
  void SetPd(PdRole role) { pd_ = role; }
  PdRole pd() const { return pd_; }

  // The peer set of stage `group` (< stages); replaces the one it had.
  void Set(uint32_t group, std::unique_ptr<elastic::ElasticPeerSet> peers);
  // The peer set of `group`, nullptr when this node does not deal with that stage.
  elastic::ElasticPeerSet* peers(uint32_t group) const;
  // Starts a peer set for every stage of the pipeline that `self` (stage `self.group`) deals
  // with. The owner watches stages 1..N-1 through `transfer` (a peer's death is a failover); a
  // later stage watches the next one (it forwards there: a dead target frees its slots at once)
  // and follows the owners through the directory alone (an owner's death drops its requests'
  // state, which is not on the critical path; watching every owner's transport would cost
  // connections and heartbeats on every stage). Every change goes to `on_change`, on the peer
  // set's thread. The first peer set that does not start returns its error.
  absl::Status Watch(directory::DirectoryClient& directory, transport::TransferEngine* transfer,
                     const Lid& self, std::function<void(const elastic::PeerChange&)> on_change);
  // Drops every peer set (none of their callbacks runs after this returns).
  void Clear();

  // Whether (lid, epoch) is a live member of its stage's peer set now.
  bool Usable(const Lid& lid, uint64_t epoch) const;
  // A route through stages 1..N-1, one sticky pick per stage (ElasticPeerSet::PickRecord): the
  // current hop of each stage if it is still live (refreshed: a migrated hop has a new epoch and
  // address), else the node's own replica, else the next live replica after it — with KV
  // standby, a dead current hop's standby instead (the next live replica after the hop's).
  // Nullopt when some stage has no live replica.
  std::optional<std::vector<Hop>> Build(const std::vector<Hop>& current) const;
  // PD: a hop of pool `group` (kPdPrefillGroup or kPdDecodeGroup): `current` refreshed while it
  // is live; with KV standby, a dead decode hop's standby (which holds its requests' mirrors);
  // else the live member with the least `load` (requests the caller has on it), ties broken
  // from the caller's own replica on (`own_replica`). Nullopt when the pool has no live member.
  std::optional<Hop> PdHop(uint32_t group, const Hop* current, const std::map<Lid, size_t>& load,
                           uint32_t own_replica) const;
  // The signal address of `stage`'s live incarnation, nullopt when it has none now.
  std::optional<std::string> SignalOf(const Lid& stage) const;
  // Whether a live or draining incarnation of `lid` (in a stage this node deals with) takes
  // signals at `address`.
  bool IsMemberSignal(const Lid& lid, const std::string& address) const;
  // Why no route can be built: for every stage without a live replica, what its peer set shows
  // ("stage 2: r0@17 failed, r1@18 draining"), "" when every stage has one.
  std::string Problem() const;
  // Whether `signal` came from a live member of a stage this node (`self`) deals with: contact
  // with the peers that would report it if they could not reach it. A STEP counts when its owner
  // is live (or is `self`); RESULT, MISSING, HOP_FAILED, STEP_ERROR and PONG when their sender's
  // incarnation is; PING and RELEASE, which carry no epoch, when their sender is a member at the
  // address it names; an ACK when it matched a send of ours (`ack_matched`).
  bool FromMember(const Signal& signal, const Lid& self, bool ack_matched) const;
  // Evicts (lid, epoch) for this sender and every other (the peer set reports it without
  // blocking); the eviction comes back as a kFailed change.
  void MarkFailed(const Lid& lid, uint64_t epoch);

 private:
  std::vector<std::unique_ptr<elastic::ElasticPeerSet>> peers_;  // by group
  bool kv_standby_ = false;
  PdRole pd_ = PdRole::kNone;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_ROUTE_TABLE_H_
