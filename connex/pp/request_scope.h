// RequestScope: the requests a downstream stage holds state for, as it knows them. A request's
// identity is (owner LID, owner token, the owner's request id): the token is drawn by each
// owner incarnation (a restarted owner that reuses ids 1, 2, ... never meets the state of its
// predecessor), and the engine sees a local id unique on this stage (two owners' request 1 never
// share a KV cache). It also remembers the last step executed for each request (a step never
// runs twice, an older attempt never takes a request back) and each owner's last epoch, so that
// the requests of an owner that FAILED or LEFT can be dropped. Thread-compatible: owned by a
// StageNode's loop thread.
#ifndef CONNEX_PP_REQUEST_SCOPE_H_
#define CONNEX_PP_REQUEST_SCOPE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "connex/base/lid.h"

namespace connex::pp {

struct OwnerKey {
  Lid lid;
  uint64_t token = 0;
  friend auto operator<=>(const OwnerKey& a, const OwnerKey& b) {
    return std::tie(a.lid, a.token) <=> std::tie(b.lid, b.token);
  }
  friend bool operator==(const OwnerKey&, const OwnerKey&) = default;
};

class RequestScope {
 public:
  struct Entry {
    uint64_t local_id = 0;
    uint64_t last_step = 0;  // 0: no step executed yet
    int64_t positions = 0;   // positions the engine holds after that step
  };

  // The entry of the owner's request `id`, or nullptr.
  Entry* Find(const OwnerKey& owner, uint64_t id);
  // The entry, created (with a fresh local id) if there is none. `owner_epoch` is the epoch the
  // owner's step carried: the owner's last one is what FAILED / LEFT events are matched with.
  Entry& FindOrCreate(const OwnerKey& owner, uint64_t owner_epoch, uint64_t id);
  // Records that `owner` was seen at `epoch` (a migrated owner keeps its token).
  void SeenAt(const OwnerKey& owner, uint64_t epoch);
  // The local id of the dropped request, if it was held.
  std::optional<uint64_t> Erase(const OwnerKey& owner, uint64_t id);
  // Drops every request of the incarnations of `lid` last seen at or before `epoch` (epochs of a
  // LID only grow: one seen earlier was that LID before `epoch` ended, and is gone with it);
  // their local ids.
  std::vector<uint64_t> EraseOwner(const Lid& lid, uint64_t epoch);
  // Whether `owner` has requests here (or was seen).
  bool Knows(const OwnerKey& owner) const { return owners_.count(owner) > 0; }

  size_t requests() const { return total_; }
  size_t owners() const { return owners_.size(); }

 private:
  struct Owner {
    uint64_t epoch = 0;
    std::map<uint64_t, Entry> requests;
  };
  std::map<OwnerKey, Owner> owners_;
  uint64_t next_local_ = 1;
  size_t total_ = 0;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_REQUEST_SCOPE_H_
