#include "connex/pp/kv_mirror_store.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/epoch_ledger.h"
#include "connex/pp/send_ring.h"

namespace connex::pp {

TensorDict SliceRows(const TensorDict& dict, int64_t begin, int64_t end) {
  TensorDict out;
  for (const auto& [name, t] : dict.tensors()) {
    CONNEX_CHECK(!t.shape.empty() && begin >= 0 && begin <= end && end <= t.shape[0]);
    const size_t row = t.shape[0] == 0 ? 0 : t.data.size() / static_cast<size_t>(t.shape[0]);
    Tensor s;
    s.dtype = t.dtype;
    s.shape = t.shape;
    s.shape[0] = end - begin;
    s.data.assign(t.data.begin() + static_cast<ptrdiff_t>(row * begin),
                  t.data.begin() + static_cast<ptrdiff_t>(row * end));
    out.Set(name, std::move(s));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<MirrorStore>> MirrorStore::Create(
    MirrorStoreOptions options, transport::TransferEngine& transfer, SendSignal send) {
  std::unique_ptr<MirrorStore> s(new MirrorStore(std::move(options), transfer, std::move(send)));
  CONNEX_ASSIGN_OR_RETURN(internal::ReadBuffers::Buffer first, s->buffers_.Take());
  s->buffers_.Give(first);
  return s;
}

MirrorStore::MirrorStore(MirrorStoreOptions options, transport::TransferEngine& transfer,
                         SendSignal send)
    : o_(std::move(options)),
      transfer_(transfer),
      send_(std::move(send)),
      buffers_(transfer, o_.slot_bytes) {}

MirrorStore::~MirrorStore() = default;

void MirrorStore::Refuse(const MirrorSignal& m, absl::StatusCode code, const std::string& why) {
  ++stats_.refused;
  MirroredSignal r;
  r.corr = m.corr;
  r.from = o_.self;
  r.code = static_cast<uint32_t>(code);
  r.message = why;
  send_(m.origin.signal, r);
}

void MirrorStore::OnMirror(const MirrorSignal& m, uint64_t epoch, int64_t now_ms) {
  if (m.target != o_.self || m.target_epoch != epoch || epoch == 0) {
    Refuse(m, absl::StatusCode::kFailedPrecondition,
           StrCat(o_.self.ToString(), ": MIRROR for ", m.target.ToString(), " epoch ",
                  m.target_epoch, " refused, this is epoch ", epoch));
    return;
  }
  if (kSlotHeaderBytes + m.length > static_cast<uint64_t>(o_.slot_bytes)) {
    Refuse(m, absl::StatusCode::kInvalidArgument,
           StrCat(o_.self.ToString(), ": MIRROR payload of ", m.length,
                  " bytes exceeds this stage's slot (CONNEX_PP_SLOT_BYTES=", o_.slot_bytes, ")"));
    return;
  }
  absl::StatusOr<internal::ReadBuffers::Buffer> buffer = buffers_.Take();
  if (!buffer.ok()) {
    Refuse(m, buffer.status().code(),
           StrCat(o_.self.ToString(),
                  ": no buffer to read the MIRROR into: ", buffer.status().message()));
    return;
  }
  const internal::ReadBuffers::Buffer b = *buffer;
  // The read's answer and time, shared with the rest, which may run after this returns (on the
  // thread that took the loop); the read itself touches nothing of the store.
  struct Read {
    absl::Status status;
    uint64_t ns = 0;
  };
  auto read = std::make_shared<Read>();
  o_.handoff.ReadThen(
      [&] {
        const int64_t start_ns = MonotonicNowNs();
        read->status = ReadSlot(transfer_, transport::PeerRef{m.origin.lid, m.origin.addresses},
                                b.slot, b.check, m.remote_addr, m.corr, m.length);
        read->ns = static_cast<uint64_t>(MonotonicNowNs() - start_ns);
      },
      [this, m, read, b, now_ms] {
        stats_.read_ns += read->ns;
        OnMirrorRead(m, read->status, static_cast<const uint8_t*>(b.slot), now_ms);
        buffers_.Give(b);
      });
}

void MirrorStore::OnMirrorRead(const MirrorSignal& m, const absl::Status& read, const uint8_t* slot,
                               int64_t now_ms) {
  if (!read.ok()) {
    Refuse(m, read.code(), std::string(read.message()));
    return;
  }
  absl::StatusOr<TensorDict> payload = Unpack(m.layout, slot + kSlotHeaderBytes, m.length);
  if (!payload.ok()) {
    Refuse(m, absl::StatusCode::kInvalidArgument,
           StrCat(o_.self.ToString(), ": bad MIRROR payload: ", payload.status().message()));
    return;
  }
  // Request i's tensors are "<i>/<key>".
  std::vector<TensorDict> per(m.request_ids.size());
  for (const auto& [name, t] : payload->tensors()) {
    const size_t slash = name.find('/');
    size_t i = 0;
    bool ok = slash != std::string::npos && slash > 0;
    for (size_t c = 0; ok && c < slash; ++c) {
      ok = name[c] >= '0' && name[c] <= '9';
      i = i * 10 + static_cast<size_t>(name[c] - '0');
    }
    ok = ok && i < per.size() && !t.shape.empty() &&
         t.shape[0] == static_cast<int64_t>(m.to[i]) - m.from[i];
    if (!ok) {
      Refuse(m, absl::StatusCode::kInvalidArgument,
             StrCat(o_.self.ToString(), ": bad MIRROR tensor '", name, "'"));
      return;
    }
    per[i].Set(name.substr(slash + 1), t);
  }
  ++stats_.updates;
  stats_.bytes_received += m.length;
  MirroredSignal r;
  r.corr = m.corr;
  r.from = o_.self;
  r.request_ids = m.request_ids;
  for (size_t i = 0; i < m.request_ids.size(); ++i) {
    r.held.push_back(Apply(m, i, std::move(per[i]), now_ms));
  }
  KeepBudget();
  // What the budget dropped is answered -1 as well.
  for (size_t i = 0; i < r.held.size(); ++i) {
    if (refused_.Contains({OwnerKey{m.owner.lid, m.owner_token}, m.request_ids[i]})) {
      r.held[i] = -1;
    }
  }
  send_(m.origin.signal, r);
}

int64_t MirrorStore::Apply(const MirrorSignal& m, size_t i, TensorDict state, int64_t now_ms) {
  const Key key{OwnerKey{m.owner.lid, m.owner_token}, m.request_ids[i]};
  if (refused_.Contains(key)) return -1;
  const int64_t from = m.from[i], rows = m.to[i] - m.from[i];
  auto it = mirrors_.find(key);
  if (it == mirrors_.end()) {
    if (from != 0) {
      ++stats_.gaps;
      return 0;  // the primary sends again from 0
    }
    it = mirrors_.emplace(key, Mirror{}).first;
    it->second.seq = next_seq_++;
    ++stats_.mirrors;
  }
  Mirror& mirror = it->second;
  if (mirror.primary != m.origin.lid || mirror.primary_epoch != m.origin.epoch) {
    mirror.primary = m.origin.lid;  // a new primary: what it sends replaces what was mirrored
    mirror.primary_epoch = m.origin.epoch;
  }
  mirror.owner_epoch = std::max(mirror.owner_epoch, m.owner.epoch);
  mirror.drop_at_ms = 0;
  mirror.updated_ms = now_ms;
  if (from > mirror.positions) {
    ++stats_.gaps;
    return mirror.positions;  // a lost update: the primary sends again from here
  }
  // Cut back to `from` (a rewind or re-prefill on the primary), then append.
  while (!mirror.chunks.empty() && mirror.chunks.back().from >= from) {
    mirror.bytes -= mirror.chunks.back().bytes;
    stats_.bytes -= static_cast<int64_t>(mirror.chunks.back().bytes);
    mirror.chunks.pop_back();
  }
  if (!mirror.chunks.empty()) {
    Chunk& last = mirror.chunks.back();
    if (last.from + last.rows > from) {
      mirror.bytes -= last.bytes;
      stats_.bytes -= static_cast<int64_t>(last.bytes);
      last.state = SliceRows(last.state, 0, from - last.from);
      last.rows = from - last.from;
      last.bytes = PackedSize(last.state);
      mirror.bytes += last.bytes;
      stats_.bytes += static_cast<int64_t>(last.bytes);
    }
  }
  if (!mirror.chunks.empty() && AppendRows(mirror.chunks.back(), state, rows)) {
    // One chunk grows by a decode step's row: no container per position.
    Chunk& last = mirror.chunks.back();
    const uint64_t before = last.bytes;
    last.bytes = PackedSize(last.state);
    mirror.bytes += last.bytes - before;
    stats_.bytes += static_cast<int64_t>(last.bytes - before);
  } else {
    Chunk c;
    c.from = from;
    c.rows = rows;
    c.bytes = PackedSize(state);
    c.state = std::move(state);
    mirror.bytes += c.bytes;
    stats_.bytes += static_cast<int64_t>(c.bytes);
    mirror.chunks.push_back(std::move(c));
  }
  mirror.positions = from + rows;
  return mirror.positions;
}

bool MirrorStore::AppendRows(Chunk& chunk, const TensorDict& state, int64_t rows) {
  const auto& have = chunk.state.tensors();
  const auto& add = state.tensors();
  if (have.size() != add.size()) return false;
  for (auto a = have.begin(), b = add.begin(); a != have.end(); ++a, ++b) {
    const Tensor& x = a->second;
    const Tensor& y = b->second;
    if (a->first != b->first || x.dtype != y.dtype || x.shape.size() != y.shape.size() ||
        !std::equal(x.shape.begin() + 1, x.shape.end(), y.shape.begin() + 1)) {
      return false;
    }
  }
  for (const auto& [name, y] : add) {
    Tensor* x = chunk.state.FindMutable(name);
    x->data.insert(x->data.end(), y.data.begin(), y.data.end());
    x->shape[0] += rows;
  }
  chunk.rows += rows;
  return true;
}

void MirrorStore::KeepBudget() {
  while (stats_.bytes > o_.budget_bytes && !mirrors_.empty()) {
    auto oldest = mirrors_.begin();
    for (auto it = mirrors_.begin(); it != mirrors_.end(); ++it) {
      if (it->second.seq < oldest->second.seq) oldest = it;
    }
    CONNEX_LOG_DEBUG(
        "pp {}: KV standby over its budget ({} > {} bytes): dropped the mirror of "
        "request {} of {}",
        o_.self.ToString(), stats_.bytes, o_.budget_bytes, oldest->first.second,
        oldest->first.first.lid.ToString());
    refused_.Insert(oldest->first);
    ++stats_.dropped_for_budget;
    Erase(oldest);
  }
}

void MirrorStore::Erase(std::map<Key, Mirror>::iterator it) {
  stats_.bytes -= static_cast<int64_t>(it->second.bytes);
  --stats_.mirrors;
  mirrors_.erase(it);
}

void MirrorStore::Drop(std::map<Key, Mirror>::iterator it) {
  ++stats_.dropped;
  Erase(it);
}

void MirrorStore::OnDrop(const MirrorDropSignal& d) {
  for (uint64_t id : d.request_ids) {
    auto it = mirrors_.find({OwnerKey{d.owner, d.owner_token}, id});
    if (it != mirrors_.end() && it->second.primary == d.from) Drop(it);
  }
}

void MirrorStore::Released(const OwnerKey& owner, const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    auto it = mirrors_.find({owner, id});
    if (it != mirrors_.end()) Drop(it);
  }
}

int64_t MirrorStore::Held(const OwnerKey& owner, uint64_t id) const {
  auto it = mirrors_.find({owner, id});
  return it == mirrors_.end() ? 0 : it->second.positions;
}

int64_t MirrorStore::TakeOver(const OwnerKey& owner, uint64_t id, uint64_t local, int64_t upto,
                              Engine& engine) {
  auto it = mirrors_.find({owner, id});
  if (it == mirrors_.end()) return 0;
  const int64_t take = std::min(upto, it->second.positions);
  int64_t imported = 0;
  for (const Chunk& c : it->second.chunks) {
    if (imported >= take) break;
    CONNEX_CHECK(c.from == imported);  // Apply keeps the chunks contiguous from 0
    const int64_t rows = std::min(c.rows, take - imported);
    absl::Status s =
        engine.ImportState(local, imported, rows == c.rows ? c.state : SliceRows(c.state, 0, rows));
    if (!s.ok()) {
      CONNEX_LOG_WARN("pp {}: importing request {}'s mirror failed (it is recomputed): {}",
                      o_.self.ToString(), id, AsStd(s.message()));
      (void)engine.DropState(local, 0);
      imported = 0;
      break;
    }
    imported += rows;
  }
  Erase(it);
  if (imported > 0 && imported == upto) ++stats_.takeovers;
  if (imported > 0 && imported < upto) ++stats_.takeovers_lagged;
  return imported;
}

void MirrorStore::OwnerGone(const Lid& lid, uint64_t epoch) {
  for (auto it = mirrors_.begin(); it != mirrors_.end();) {
    auto next = std::next(it);
    if (it->first.first.lid == lid && it->second.owner_epoch <= epoch) Drop(it);
    it = next;
  }
}

void MirrorStore::PrimaryGone(const Lid& lid, uint64_t epoch, int64_t now_ms) {
  for (auto& [key, m] : mirrors_) {
    if (m.primary == lid && m.primary_epoch <= epoch && m.drop_at_ms == 0) {
      m.drop_at_ms = now_ms + o_.orphan_grace_ms;
    }
  }
}

void MirrorStore::Tick(int64_t now_ms) {
  for (auto it = mirrors_.begin(); it != mirrors_.end();) {
    auto next = std::next(it);
    const Mirror& m = it->second;
    if ((m.drop_at_ms > 0 && m.drop_at_ms <= now_ms) ||
        now_ms - m.updated_ms > o_.orphan_grace_ms) {
      Drop(it);
    }
    it = next;
  }
}

}  // namespace connex::pp
