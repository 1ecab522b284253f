#include "connex/pp/request_scope.h"

namespace connex::pp {

RequestScope::Entry* RequestScope::Find(const OwnerKey& owner, uint64_t id) {
  auto o = owners_.find(owner);
  if (o == owners_.end()) return nullptr;
  auto r = o->second.requests.find(id);
  return r == o->second.requests.end() ? nullptr : &r->second;
}

RequestScope::Entry& RequestScope::FindOrCreate(const OwnerKey& owner, uint64_t owner_epoch,
                                                uint64_t id) {
  Owner& o = owners_[owner];
  if (owner_epoch > o.epoch) o.epoch = owner_epoch;
  auto [it, inserted] = o.requests.try_emplace(id);
  if (inserted) {
    it->second.local_id = next_local_++;
    ++total_;
  }
  return it->second;
}

void RequestScope::SeenAt(const OwnerKey& owner, uint64_t epoch) {
  auto o = owners_.find(owner);
  if (o != owners_.end() && epoch > o->second.epoch) o->second.epoch = epoch;
}

std::optional<uint64_t> RequestScope::Erase(const OwnerKey& owner, uint64_t id) {
  auto o = owners_.find(owner);
  if (o == owners_.end()) return std::nullopt;
  auto r = o->second.requests.find(id);
  if (r == o->second.requests.end()) return std::nullopt;
  uint64_t local = r->second.local_id;
  o->second.requests.erase(r);
  --total_;
  if (o->second.requests.empty()) owners_.erase(o);
  return local;
}

std::vector<uint64_t> RequestScope::EraseOwner(const Lid& lid, uint64_t epoch) {
  std::vector<uint64_t> out;
  for (auto it = owners_.lower_bound(OwnerKey{lid, 0});
       it != owners_.end() && it->first.lid == lid;) {
    // At or before: an incarnation last seen under an older epoch of the LID is gone too. The
    // owner may have joined again (a directory that lost its state) without sending this stage a
    // step under its new epoch before it died (campaign seed 33: its state stayed for ever).
    if (it->second.epoch > epoch) {
      ++it;
      continue;
    }
    for (const auto& [id, e] : it->second.requests) out.push_back(e.local_id);
    total_ -= it->second.requests.size();
    it = owners_.erase(it);
  }
  return out;
}

}  // namespace connex::pp
