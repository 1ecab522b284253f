#include "connex/pp/internal/registration.h"

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"
#include "connex/directory/protocol.h"

namespace connex::pp::internal {

void Registration::OnChange(const Lid& lid, const directory::RegistrationChange& c) {
  if (c.lid != lid) return;
  if (c.status.ok()) {
    AdvanceEpoch(c.new_epoch);
  } else if (c.new_epoch == 0) {
    if (c.left) ended_by_leave.store(true);
    connex::MutexLock lock(&mu);
    lost = Annotate(c.status,
                    StrCat("pp: ", lid.ToString(), " lost its LID (epoch ", c.old_epoch, ")"));
  }
}

void Registration::OnEvent(const Lid& lid, const directory::Event& e) {
  if (e.record.lid != lid) return;
  if (e.kind == directory::EventKind::kFailed) {
    Revoke(e.record.epoch, StrCat(directory::EventKindName(e.kind), e.reason.empty() ? "" : " (",
                                  e.reason, e.reason.empty() ? "" : ")"));
  } else if (e.kind == directory::EventKind::kLeft && !leaving.load() &&
             e.record.epoch == epoch.load()) {
    operator_drain.store(true);
  }
}

}  // namespace connex::pp::internal
