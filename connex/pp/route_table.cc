#include "connex/pp/route_table.h"

#include "connex/base/check.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/signal_transport.h"

namespace connex::pp {

Hop HopFromRecord(const directory::Record& r) {
  Hop hop;
  hop.lid = r.lid;
  hop.epoch = r.epoch;
  for (const std::string& a : r.addresses) {
    if (a.rfind(kSignalScheme, 0) == 0) {
      hop.signal = a;
    } else if (a.rfind("zmq+", 0) != 0) {
      hop.addresses.push_back(a);
    }
  }
  return hop;
}

std::string RouteKey(const std::vector<Hop>& route) {
  std::string key;
  for (const Hop& h : route) key += StrCat(h.lid.ToString(), "@", h.epoch, ";");
  return key;
}

std::optional<directory::Record> NextReplicaAfter(const std::vector<directory::Record>& live,
                                                  uint32_t replica) {
  const directory::Record* after = nullptr;  // the smallest replica above ours
  const directory::Record* first = nullptr;  // the smallest of all (wrapping around)
  for (const directory::Record& r : live) {
    if (r.lid.replica == replica) continue;
    if (first == nullptr || r.lid.replica < first->lid.replica) first = &r;
    if (r.lid.replica > replica && (after == nullptr || r.lid.replica < after->lid.replica)) {
      after = &r;
    }
  }
  if (after != nullptr) return *after;
  if (first != nullptr) return *first;
  return std::nullopt;
}

bool DealsWith(uint32_t stage, uint32_t group) {
  return stage == 0 ? group != 0 : (group == 0 || group == stage + 1);
}

absl::Status RouteTable::Watch(directory::DirectoryClient& directory,
                               transport::TransferEngine* transfer, const Lid& self,
                               std::function<void(const elastic::PeerChange&)> on_change) {
  for (uint32_t g = 0; g < peers_.size(); ++g) {
    const bool own = kv_standby_ && g == self.group && g != 0 && pd_ != PdRole::kPrefill;
    const bool deals = pd_ == PdRole::kNone ? DealsWith(self.group, g)
                                            : (self.group == 0 ? g != 0 : g != self.group);
    if (!deals && !own) continue;
    // The owners and our own stage (and, in PD, the other pool) are followed through the
    // directory alone.
    transport::TransferEngine* watch =
        (self.group != 0 && (g == 0 || own || pd_ != PdRole::kNone)) ? nullptr : transfer;
    elastic::ElasticPeerSetOptions po;
    po.model = self.model;
    po.group = g;
    po.own_replica = self.replica;
    po.reporter = self.ToString();
    po.shard = 0;
    po.member_address_prefix = std::string(kSignalScheme);
    auto set = std::make_unique<elastic::ElasticPeerSet>(directory, watch, po);
    set->OnChange(on_change);
    CONNEX_RETURN_IF_ERROR(set->Start());
    Set(g, std::move(set));
  }
  return absl::OkStatus();
}

bool RouteTable::FromMember(const Signal& signal, const Lid& self, bool ack_matched) const {
  if (const auto* s = std::get_if<StepSignal>(&signal)) {
    return Usable(s->owner.lid, s->owner.epoch) || s->owner.lid == self;
  }
  if (const auto* r = std::get_if<ResultSignal>(&signal)) return Usable(r->from, r->from_epoch);
  if (const auto* m = std::get_if<MissingSignal>(&signal)) return Usable(m->from, m->from_epoch);
  if (const auto* f = std::get_if<HopFailedSignal>(&signal)) return Usable(f->from, f->from_epoch);
  if (const auto* e = std::get_if<StepErrorSignal>(&signal)) return Usable(e->from, e->from_epoch);
  if (const auto* p = std::get_if<PongSignal>(&signal)) return Usable(p->from, p->epoch);
  if (const auto* p = std::get_if<PingSignal>(&signal)) return IsMemberSignal(p->from, p->reply_to);
  if (const auto* r = std::get_if<ReleaseSignal>(&signal)) {
    return IsMemberSignal(r->from, r->reply_to);
  }
  if (std::holds_alternative<AckSignal>(signal)) return ack_matched;
  return false;
}

void RouteTable::Set(uint32_t group, std::unique_ptr<elastic::ElasticPeerSet> peers) {
  CONNEX_CHECK(group < peers_.size());
  peers_[group] = std::move(peers);
}

elastic::ElasticPeerSet* RouteTable::peers(uint32_t group) const {
  return group < peers_.size() ? peers_[group].get() : nullptr;
}

void RouteTable::Clear() {
  for (auto& p : peers_) p.reset();
}

bool RouteTable::Usable(const Lid& lid, uint64_t epoch) const {
  elastic::ElasticPeerSet* p = peers(lid.group);
  return p != nullptr && p->IsUsable(lid, epoch);
}

std::optional<std::vector<Hop>> RouteTable::Build(const std::vector<Hop>& current) const {
  if (pd_ != PdRole::kNone) {
    // One hop, kept in its pool (the owner picks a fresh request's pool with PdHop).
    if (current.size() != 1) return std::nullopt;
    std::optional<Hop> hop = PdHop(current[0].lid.group, &current[0], {}, current[0].lid.replica);
    if (!hop) return std::nullopt;
    return std::vector<Hop>{*hop};
  }
  std::vector<Hop> route;
  const bool sticky = current.size() + 1 == peers_.size();
  for (uint32_t g = 1; g < peers_.size(); ++g) {
    elastic::ElasticPeerSet* p = peers(g);
    if (p == nullptr) return std::nullopt;
    const Lid* hop = sticky ? &current[g - 1].lid : nullptr;
    if (kv_standby_ && hop != nullptr && !p->Live(*hop)) {
      // A dead hop's steps go to its standby, which holds its requests' state.
      std::optional<directory::Record> standby = NextReplicaAfter(p->Peers(), hop->replica);
      if (!standby) return std::nullopt;
      route.push_back(HopFromRecord(*standby));
      continue;
    }
    absl::StatusOr<directory::Record> pick = p->PickRecord(hop);
    if (!pick.ok()) return std::nullopt;
    route.push_back(HopFromRecord(*pick));
  }
  return route;
}

std::optional<Hop> RouteTable::PdHop(uint32_t group, const Hop* current,
                                     const std::map<Lid, size_t>& load,
                                     uint32_t own_replica) const {
  elastic::ElasticPeerSet* p = peers(group);
  if (p == nullptr) return std::nullopt;
  if (current != nullptr && current->lid.group == group) {
    if (std::optional<directory::Record> live = p->Live(current->lid)) {
      return HopFromRecord(*live);
    }
    if (kv_standby_ && group == kPdDecodeGroup) {
      // A dead decode hop's requests are mirrored on its standby.
      std::optional<directory::Record> standby = NextReplicaAfter(p->Peers(), current->lid.replica);
      if (!standby) return std::nullopt;
      return HopFromRecord(*standby);
    }
  }
  const std::vector<directory::Record> live = p->Peers();
  const directory::Record* best = nullptr;
  size_t best_load = 0;
  uint32_t best_order = 0;
  for (const directory::Record& r : live) {
    auto l = load.find(r.lid);
    const size_t n = l == load.end() ? 0 : l->second;
    // Ties: the caller's own replica first, then the ones after it (wrapping around).
    const uint32_t order = r.lid.replica - own_replica;
    if (best == nullptr || n < best_load || (n == best_load && order < best_order)) {
      best = &r;
      best_load = n;
      best_order = order;
    }
  }
  if (best == nullptr) return std::nullopt;
  return HopFromRecord(*best);
}

std::optional<std::string> RouteTable::SignalOf(const Lid& stage) const {
  elastic::ElasticPeerSet* p = peers(stage.group);
  if (p == nullptr) return std::nullopt;
  std::optional<directory::Record> rec = p->Live(stage);
  if (!rec) return std::nullopt;
  return HopFromRecord(*rec).signal;
}

bool RouteTable::IsMemberSignal(const Lid& lid, const std::string& address) const {
  if (address.empty()) return false;
  elastic::ElasticPeerSet* p = peers(lid.group);
  if (p == nullptr) return false;
  for (const elastic::PeerInfo& info : p->Members()) {
    if (info.record.lid != lid || info.state == elastic::PeerState::kFailed) continue;
    if (HopFromRecord(info.record).signal == address) return true;
  }
  return false;
}

std::string RouteTable::Problem() const {
  std::string out;
  for (uint32_t g = 1; g < peers_.size(); ++g) {
    std::string seen;
    bool usable = false;
    if (elastic::ElasticPeerSet* p = peers(g)) {
      for (const elastic::PeerInfo& info : p->Members()) {
        usable |= info.state == elastic::PeerState::kLive;
        seen += StrCat(seen.empty() ? "" : ", ", "r", info.record.lid.replica, "@",
                       info.record.epoch, " ", elastic::PeerStateName(info.state));
      }
    }
    if (usable) continue;
    const std::string what =
        pd_ != PdRole::kNone ? StrCat(PdGroupName(g), " pool") : StrCat("stage ", g);
    out +=
        StrCat(out.empty() ? "" : "; ", what, ": ", seen.empty() ? "no replica registered" : seen);
  }
  return out;
}

void RouteTable::MarkFailed(const Lid& lid, uint64_t epoch) {
  if (elastic::ElasticPeerSet* p = peers(lid.group)) (void)p->MarkFailed(lid, epoch);
}

}  // namespace connex::pp
