// The resume proxy's choice of a stage-0 replica for an attempt: the least busy replica that is
// up, preferring one other than the one that failed the request last. A replica that failed an
// attempt rests kReplicaDownMs; one that refuses connections again and again (a dead process
// whose lease has not run out yet) twice as long each time, up to kMaxReplicaDownMs. A rest
// after a stream that broke (it connected, then fell silent or closed) is a preference only:
// when no replica is up, such a replica is picked rather than none. A stream also falls silent
// when a stage behind the replica is lost, which the replica routes around in under a second, so
// every replica's streams may break at once (a host that held a later stage of both chains cut
// off: every request then waited the whole rest, 1 s, for nothing); a replica that is gone shows
// it at the next connect, which is a rest of its own.
// The directory drops a dead replica within a lease; its restart is a new epoch, hence a new
// replica (a new name) with a clean slate. Thread-compatible (the proxy's I/O thread).
#ifndef CONNEX_SERVING_INTERNAL_REPLICA_BALANCER_H_
#define CONNEX_SERVING_INTERNAL_REPLICA_BALANCER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "connex/serving/proxy.h"

namespace connex::serving::internal {

inline constexpr int64_t kReplicaDownMs = 1'000;
inline constexpr int64_t kMaxReplicaDownMs = 4'000;

class ReplicaBalancer {
 public:
  using Clock = std::chrono::steady_clock;

  // The least busy of `replicas` that is up at `now`, one not named `avoid` if there is one;
  // when none is up, the same among those resting after a broken stream only; else nullopt. Forgets
  // the state of replicas no longer listed (unless in flight).
  std::optional<Replica> Pick(const std::vector<Replica>& replicas, std::string_view avoid,
                              Clock::time_point now);
  // When the earliest of `replicas` that is down comes back; nullopt when none has been down.
  std::optional<Clock::time_point> NextUp(const std::vector<Replica>& replicas) const;

  void Started(const std::string& name) { ++state_[name].inflight; }
  void Ended(const std::string& name);
  // The attempt connected: its connection refusals in a row are over.
  void Connected(const std::string& name) { state_[name].connect_failures = 0; }
  // The attempt failed (`connect`: it could not connect) at `now`.
  void Failed(const std::string& name, bool connect, Clock::time_point now);

  int inflight(const std::string& name) const;
  bool Up(const std::string& name, Clock::time_point now) const;

 private:
  struct State {
    int inflight = 0;
    int connect_failures = 0;  // in a row
    Clock::time_point down_until{};
  };
  std::map<std::string, State> state_;  // by replica name
};

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_REPLICA_BALANCER_H_
