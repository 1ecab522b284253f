// A StageNode incarnation's registration: the epoch it holds, whether the directory evicted it
// and why, and the notices of its own LEAVE and of an operator's drain. Shared between the node's
// loop, its EpochGuard and the directory client's callbacks (which may outlive the node), so
// every field is atomic or guarded. OnChange and OnEvent are those callbacks' rules.
#ifndef CONNEX_PP_INTERNAL_REGISTRATION_H_
#define CONNEX_PP_INTERNAL_REGISTRATION_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "connex/base/lid.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"

namespace connex::directory {
struct Event;
struct RegistrationChange;
}  // namespace connex::directory

namespace connex::pp::internal {

struct Registration {
  std::atomic<uint64_t> epoch{0};
  std::atomic<bool> fenced{false};  // the LID is lost: the epoch stays 0
  connex::Mutex mu;
  absl::Status lost ABSL_GUARDED_BY(mu);

  // Epochs only grow: the notice of a rejoin that arrives after our own migration's JOIN
  // (a newer epoch) must not take the node back to the older one, whose steps are fenced.
  void AdvanceEpoch(uint64_t e) {
    uint64_t current = epoch.load();
    while (e > current && !epoch.compare_exchange_weak(current, e)) {
    }
    if (fenced.load()) epoch.store(0);
  }
  void Fence() {
    fenced.store(true);
    epoch.store(0);
  }

  // The directory evicted `e`: if it is the epoch held now, its steps are refused until the
  // client's rejoin brings a new one.
  std::atomic<uint64_t> revoked{0};
  std::atomic<bool> leaving{false};         // our own LEAVE: its LEFT is not an eviction
  std::atomic<bool> operator_drain{false};  // a LEFT of our epoch that was not our LEAVE
  // The directory refused our epoch as ended by a LEAVE (RegistrationChange::left): ours, or an
  // operator's drain whose LEFT event had not come yet.
  std::atomic<bool> ended_by_leave{false};
  std::string revoked_why ABSL_GUARDED_BY(mu);
  void Revoke(uint64_t e, std::string why) {
    connex::MutexLock lock(&mu);
    if (e == 0 || epoch.load() != e || revoked.load() == e) return;
    revoked_why = std::move(why);
    revoked.store(e);
    CONNEX_LOG_WARN("pp: epoch {} was evicted ({}): its steps are refused until it joins again", e,
                    revoked_why);
  }
  std::string RevokedWhy() {
    connex::MutexLock lock(&mu);
    return revoked_why;
  }

  // The directory client's notice about a registration; only `lid`'s (ours) counts. A rejoin
  // advances the epoch; a registration given up loses the LID (`lost`), and notes whether its
  // epoch ended by a LEAVE (ours, or an operator's drain whose LEFT event may come later).
  void OnChange(const Lid& lid, const directory::RegistrationChange& change);
  // A directory event; only `lid`'s (ours) counts. A FAILED of the epoch held (a sender's report,
  // a lease run out) revokes it at once: its steps are refused while the client joins again. A
  // LEFT of it that is not our own LEAVE is an operator's drain (only the holder or the admin
  // token can end an epoch gracefully): no fence; the node drains.
  void OnEvent(const Lid& lid, const directory::Event& event);
};

}  // namespace connex::pp::internal

#endif  // CONNEX_PP_INTERNAL_REGISTRATION_H_
