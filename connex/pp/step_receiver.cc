#include "connex/pp/step_receiver.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/internal/batch_select.h"
#include "connex/pp/send_ring.h"

namespace connex::pp {

absl::StatusOr<Signal> LastStageAnswer(const StepSignal& s, const TensorDict& out, const Lid& self,
                                       uint64_t epoch) {
  absl::StatusOr<Batch> b = GetBatch(out);
  if (!b.ok()) {
    return absl::InvalidArgumentError(StrCat("the engine's last-stage output of step ", s.step,
                                             " has no valid batch: ", b.status().message()));
  }
  absl::StatusOr<const Tensor*> next = out.Get(kNextTokens, DType::kI32, 1);
  if (!next.ok()) {
    return StepErrorSignal{s.step,
                           s.attempt,
                           self,
                           b->request_ids,
                           static_cast<uint32_t>(absl::StatusCode::kInternal),
                           StrCat(self.ToString(), ": the engine returned no ", kNextTokens),
                           epoch,
                           s.ticket};
  }
  auto tokens = (*next)->values<int32_t>();
  return ResultSignal{
      s.step, s.attempt, self, b->request_ids, std::vector<int32_t>(tokens.begin(), tokens.end()),
      epoch,  s.ticket};
}
namespace {

constexpr size_t kSeenCorrs = 8192;
constexpr size_t kReplayEntries = 2048;
constexpr size_t kGoneOwners = 4096;
constexpr size_t kReleasedRequests = 16384;

transport::PeerRef PeerOf(const Hop& hop) { return transport::PeerRef{hop.lid, hop.addresses}; }

}  // namespace

absl::StatusOr<std::unique_ptr<StepReceiver>> StepReceiver::Create(
    StepReceiverOptions options, Engine& engine, transport::TransferEngine& transfer, Epoch epoch,
    SendSignal send, Deliver deliver) {
  std::unique_ptr<StepReceiver> r(new StepReceiver(
      std::move(options), engine, transfer, std::move(epoch), std::move(send), std::move(deliver)));
  CONNEX_ASSIGN_OR_RETURN(internal::ReadBuffers::Buffer first, r->buffers_.Take());
  r->buffers_.Give(first);
  return r;
}

StepReceiver::StepReceiver(StepReceiverOptions options, Engine& engine,
                           transport::TransferEngine& transfer, Epoch epoch, SendSignal send,
                           Deliver deliver)
    : o_(std::move(options)),
      engine_(engine),
      transfer_(transfer),
      epoch_(std::move(epoch)),
      send_(std::move(send)),
      deliver_(std::move(deliver)),
      buffers_(transfer, o_.slot_bytes),
      seen_corr_(kSeenCorrs),
      gone_owners_(kGoneOwners),
      released_(kReleasedRequests),
      replay_(kReplayEntries, static_cast<uint64_t>(o_.replay_cache_bytes)) {}

StepReceiver::~StepReceiver() = default;

void StepReceiver::OwnerLeft(const Lid& lid, uint64_t epoch, int64_t drop_at_ms) {
  owners_leaving_[{lid, epoch}] = drop_at_ms;
}

void StepReceiver::Tick(int64_t now_ms) {
  for (auto it = owners_leaving_.begin(); it != owners_leaving_.end();) {
    if (it->second > now_ms) {
      ++it;
      continue;
    }
    DropOwner(it->first.first, it->first.second, "LEFT");
    it = owners_leaving_.erase(it);
  }
}

std::optional<AckSignal> StepReceiver::Refusal(const StepSignal& s, bool admit) {
  const Hop& target = s.target();
  const uint64_t epoch = epoch_();
  AckSignal ack;
  ack.corr = s.corr;
  ack.from = o_.self;
  if (target.lid != o_.self || target.epoch != epoch || epoch == 0) {
    ack.code = static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition);
    ack.message = StrCat(o_.self.ToString(), ": step for ", target.lid.ToString(), " epoch ",
                         target.epoch, " refused, this is epoch ", epoch);
    return ack;
  }
  if (admit && o_.admit) {
    if (absl::Status admitted = o_.admit(epoch); !admitted.ok()) {
      ack.code = static_cast<uint32_t>(admitted.code());
      ack.message =
          StrCat(o_.self.ToString(), ": step for epoch ", epoch, " refused: ", admitted.message());
      return ack;
    }
  }
  if (const uint64_t* gone = gone_owners_.Find(s.owner.lid);
      gone != nullptr && s.owner.epoch <= *gone) {
    // Its requests were dropped here: running its step would make state nobody releases.
    ack.code = static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition);
    ack.message = StrCat(o_.self.ToString(), ": owner ", s.owner.lid.ToString(), " epoch ",
                         s.owner.epoch, " is gone");
    return ack;
  }
  return std::nullopt;
}

// What can be refused without the payload is, before it is read (a step of a fenced epoch or
// a gone owner costs no read); the rest, and all of it again, once it was read (OnRead).
void StepReceiver::OnStep(const StepSignal& s) {
  if (std::optional<AckSignal> refused = Refusal(s, /*admit=*/false)) {
    ++stats_.fenced;
    send_(s.origin.signal, *refused);
    return;
  }
  AckSignal ack;
  ack.corr = s.corr;
  ack.from = o_.self;
  if (seen_corr_.Contains(s.corr)) {
    ++stats_.duplicates_dropped;
    // The first ACK may have been lost: acknowledged again (a step still being read, once it
    // was: never before its slot is free).
    if (auto being_read = reading_.find(s.corr); being_read != reading_.end()) {
      ++being_read->second;
    } else {
      send_(s.origin.signal, ack);
    }
    return;
  }
  seen_corr_.Insert(s.corr);
  if (kSlotHeaderBytes + s.length > static_cast<uint64_t>(o_.slot_bytes)) {
    ack.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
    ack.message =
        StrCat(o_.self.ToString(), ": payload of ", s.length,
               " bytes exceeds this stage's slot (CONNEX_PP_SLOT_BYTES=", o_.slot_bytes, ")");
    send_(s.origin.signal, ack);
    return;
  }
  absl::StatusOr<internal::ReadBuffers::Buffer> buffer = buffers_.Take();
  if (!buffer.ok()) {
    ack.code = static_cast<uint32_t>(buffer.status().code());
    ack.message = StrCat(o_.self.ToString(),
                         ": no buffer to read the step into: ", buffer.status().message());
    send_(s.origin.signal, ack);
    return;
  }
  const internal::ReadBuffers::Buffer b = *buffer;
  // Shared with the rest, which may run after this returns (on the thread that took the loop).
  auto read = std::make_shared<absl::Status>();
  auto read_slot = [&] {
    *read = ReadSlot(transfer_, PeerOf(s.origin), b.slot, b.check, s.remote_addr, s.corr, s.length);
  };
  // Duplicates of the signal that arrive while it is read (the loop may have moved to the other
  // thread) are counted here and acknowledged with it.
  reading_[s.corr] = 0;
  o_.handoff.ReadThen(read_slot, [this, s, read, b] {
    auto it = reading_.find(s.corr);
    CONNEX_CHECK(it != reading_.end());
    const int repeats = it->second;
    reading_.erase(it);
    OnRead(s, *read, static_cast<const uint8_t*>(b.slot), repeats);
    buffers_.Give(b);
  });
}

void StepReceiver::Acknowledge(const StepSignal& s, const AckSignal& ack, int repeats) {
  for (int i = 0; i <= repeats; ++i) send_(s.origin.signal, ack);
}

void StepReceiver::OnRead(const StepSignal& s, const absl::Status& read, const uint8_t* slot,
                          int repeats) {
  // Taken before the epoch is checked: a step executed under an epoch was admitted at or before
  // this time (a process frozen right after it still ran it "before").
  const int64_t admitted_ns = MonotonicNowNs();
  if (std::optional<AckSignal> refused = Refusal(s, /*admit=*/true)) {
    ++stats_.fenced;
    Acknowledge(s, *refused, repeats);
    return;
  }
  const uint64_t epoch = epoch_();
  AckSignal ack;
  ack.corr = s.corr;
  ack.from = o_.self;
  if (!read.ok()) {
    ack.code = static_cast<uint32_t>(read.code());
    ack.message = std::string(read.message());
    Acknowledge(s, ack, repeats);
    return;
  }
  absl::StatusOr<TensorDict> in = Unpack(s.layout, slot + kSlotHeaderBytes, s.length);
  absl::StatusOr<Batch> batch = in.ok() ? GetBatch(*in) : absl::StatusOr<Batch>(in.status());
  if (batch.ok() &&
      (batch->request_ids != s.request_ids || batch->start_positions != s.start_positions ||
       batch->num_tokens != s.num_tokens)) {
    batch = absl::InvalidArgumentError("the payload's batch differs from the signal's");
  }
  if (!batch.ok()) {
    // A malformed step is the sender's bug or a forgery: refuse it, by name; never run it.
    ack.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
    ack.message = StrCat(o_.self.ToString(), ": bad payload of step ", s.step, ": ",
                         batch.status().message());
    CONNEX_LOG_WARN("pp {}", ack.message);
    Acknowledge(s, ack, repeats);
    return;
  }
  Acknowledge(s, ack, repeats);  // the slot is free: the payload is ours
  const OwnerKey owner{s.owner.lid, s.owner_token};
  scope_.SeenAt(owner, s.owner.epoch);
  // A re-sent attempt of a step this stage already ran: answer from the replay cache, for the
  // requests whose last step here is this one (a step is never executed twice on a stage, and
  // a request that has moved on is never taken back).
  const StepKey key{s.owner.lid, s.owner_token, s.step};
  if (const TensorDict* cached = replay_.Find(key)) {
    absl::StatusOr<Batch> cb = GetBatch(*cached);
    if (!cb.ok()) return;
    std::set<uint64_t> wanted(s.request_ids.begin(), s.request_ids.end());
    std::vector<bool> keep;
    bool any = false;
    for (uint64_t id : cb->request_ids) {
      RequestScope::Entry* e = scope_.Find(owner, id);
      keep.push_back(wanted.count(id) && e != nullptr && e->last_step == s.step);
      any |= keep.back();
    }
    // A request whose state went since the step ran here (its owner incarnation was declared
    // failed, yet lives on under a new epoch and re-sends) cannot be answered from the cache:
    // it is reported missing, so that the owner recomputes it. Silence would make the owner
    // re-send the step until its attempts ran out (campaign seed 15, a directory restart that
    // lost its state).
    std::vector<uint64_t> missing;
    for (uint64_t id : s.request_ids) {
      const uint64_t* released = released_.Find({s.owner_token, id});
      if (released != nullptr && *released >= s.step) continue;  // the owner is done with it
      RequestScope::Entry* e = scope_.Find(owner, id);
      if (e == nullptr || e->last_step < s.step) missing.push_back(id);
    }
    if (!missing.empty()) {
      ++stats_.missing_reported;
      send_(s.owner.signal,
            MissingSignal{s.step, s.attempt, o_.self, missing, epoch, s.ticket, {}});
    }
    if (!any) return;
    ++stats_.steps_replayed;
    deliver_(s, internal::Select(*cached, *cb, keep));
    return;
  }
  std::vector<bool> keep;
  std::vector<uint64_t> missing;
  std::vector<int32_t> held;  // parallel to `missing`: positions a standby's mirror gave
  const std::set<uint64_t> rewind(s.rewind.begin(), s.rewind.end());
  for (size_t i = 0; i < batch->request_ids.size(); ++i) {
    const uint64_t id = batch->request_ids[i];
    const int64_t start = batch->start_positions[i];
    const uint64_t* released = released_.Find({s.owner_token, id});
    if (released != nullptr && *released >= s.step) {
      keep.push_back(false);  // a late step of a request its owner is done with
      continue;
    }
    RequestScope::Entry* e = scope_.Find(owner, id);
    bool fresh = e == nullptr || e->last_step < s.step;
    if (!fresh && e->last_step == s.step) {
      missing.push_back(id);  // no output
      held.push_back(0);
    }
    if (fresh && e != nullptr && start != 0 && e->positions > start && rewind.count(id)) {
      // The owner recomputes from `start` what a standby lacked: cut back to it.
      if (engine_.DropState(e->local_id, start).ok()) {
        e->positions = start;
        ++stats_.rewound;
      }
    }
    if (fresh && e != nullptr && start != 0 && e->positions != start) {
      // This stage's state is of another point of the request's history (it was away from
      // the route while the request moved on, was recomputed elsewhere, and came back): the
      // engine must hold exactly start_position positions, so it goes (a standby's mirror may
      // still serve, below).
      engine_.Release(e->local_id);
      scope_.Erase(owner, id);
      e = nullptr;
    }
    // Without state here, only a step from position 0 can run (it creates the state), unless
    // this stage is the standby of the stage that held it and imports its mirror.
    if (fresh && e == nullptr && start != 0) {
      int64_t got = 0;
      if (o_.standby != nullptr) {
        RequestScope::Entry& taken = scope_.FindOrCreate(owner, s.owner.epoch, id);
        got = o_.standby->TakeOver(owner, id, taken.local_id, start);
        if (got > 0) {
          taken.positions = got;
        } else {
          scope_.Erase(owner, id);
        }
      }
      if (got != start) {
        missing.push_back(id);
        held.push_back(static_cast<int32_t>(got));
        fresh = false;
      }
    }
    keep.push_back(fresh);
  }
  // The engine sees this stage's local ids.
  std::vector<uint64_t> owner_ids, local_ids;
  std::vector<bool> created;
  for (size_t i = 0; i < keep.size(); ++i) {
    if (!keep[i]) continue;
    uint64_t id = batch->request_ids[i];
    created.push_back(scope_.Find(owner, id) == nullptr);
    owner_ids.push_back(id);
    local_ids.push_back(scope_.FindOrCreate(owner, s.owner.epoch, id).local_id);
  }
  TensorDict runnable = internal::Select(*in, *batch, keep);
  internal::RewriteIds(runnable, local_ids);
  std::set<uint64_t> lost;
  for (uint64_t local : engine_.MissingRequests(runnable)) lost.insert(local);
  if (!lost.empty()) {
    for (size_t i = 0; i < local_ids.size(); ++i) {
      if (!lost.count(local_ids[i])) continue;
      missing.push_back(owner_ids[i]);
      held.push_back(0);
      if (created[i]) scope_.Erase(owner, owner_ids[i]);
    }
  }
  if (!missing.empty()) {
    ++stats_.missing_reported;
    MissingSignal m{s.step, s.attempt, o_.self, missing, epoch, s.ticket, {}};
    if (std::any_of(held.begin(), held.end(), [](int32_t h) { return h > 0; })) m.held = held;
    send_(s.owner.signal, m);
  }
  std::vector<bool> run(local_ids.size());
  std::vector<uint64_t> run_owner, run_local;
  for (size_t i = 0; i < local_ids.size(); ++i) {
    run[i] = !lost.count(local_ids[i]);
    if (!run[i]) continue;
    run_owner.push_back(owner_ids[i]);
    run_local.push_back(local_ids[i]);
  }
  if (run_owner.empty()) return;
  if (!lost.empty()) {
    absl::StatusOr<Batch> rb = GetBatch(runnable);
    if (!rb.ok()) return;
    runnable = internal::Select(runnable, *rb, run);
  }
  absl::StatusOr<TensorDict> out = engine_.ExecuteStep(runnable);
  if (!out.ok()) {
    // Not "missing": the engine failed. The owner ends these requests with this error.
    CONNEX_LOG_WARN("pp {}: step {} failed: {}", o_.self.ToString(), s.step,
                    AsStd(out.status().message()));
    for (size_t i = 0; i < run_owner.size(); ++i) {
      if (!engine_.HoldsRequest(run_local[i])) scope_.Erase(owner, run_owner[i]);
    }
    send_(s.owner.signal, StepErrorSignal{s.step, s.attempt, o_.self, run_owner,
                                          static_cast<uint32_t>(out.status().code()),
                                          StrCat(o_.self.ToString(), ": ", out.status().message()),
                                          epoch, s.ticket});
    return;
  }
  ++stats_.steps_executed;
  if (o_.executed != nullptr) o_.executed->Executed(epoch, admitted_ns);
  {
    absl::StatusOr<Batch> ran = GetBatch(runnable);
    for (size_t i = 0; ran.ok() && i < run_owner.size(); ++i) {
      RequestScope::Entry* e = scope_.Find(owner, run_owner[i]);
      CONNEX_CHECK(e != nullptr);  // created above, before the engine ran
      e->last_step = s.step;
      e->positions = static_cast<int64_t>(ran->start_positions[i]) + ran->num_tokens[i];
    }
  }
  internal::RewriteIds(*out, run_owner);
  if (o_.stage + 1 == o_.stages) {
    // Only what a re-send needs: the batch and the sampled tokens, never the logits.
    TensorDict kept;
    for (const char* name : {kRequestIds, kStartPositions, kNumTokens, kNextTokens}) {
      if (const Tensor* t = out->Find(name)) kept.Set(name, *t);
    }
    replay_.Put(key, kept);
  } else {
    replay_.Put(key, *out);
  }
  deliver_(s, *out);
  if (o_.standby != nullptr) {
    // After the output went on: mirroring is off the step's critical path.
    absl::StatusOr<Batch> ran = GetBatch(runnable);
    if (ran.ok()) {
      std::vector<int64_t> starts, ends;
      for (size_t i = 0; i < ran->request_ids.size(); ++i) {
        starts.push_back(ran->start_positions[i]);
        ends.push_back(static_cast<int64_t>(ran->start_positions[i]) + ran->num_tokens[i]);
      }
      o_.standby->Ran(s, run_owner, run_local, starts, ends);
    }
  }
}

void StepReceiver::OnRelease(const ReleaseSignal& r) {
  const OwnerKey owner{r.from, r.owner_token};
  if (!scope_.Knows(owner)) {
    // Nothing of that owner is held (released before, or a forgery): acknowledge, change
    // nothing.
    if (r.owner_token == 0) ++stats_.forged_dropped;
  }
  for (uint64_t id : r.request_ids) {
    if (r.owner_token != 0) released_.Put({r.owner_token, id}, r.upto_step);
    std::optional<uint64_t> local = scope_.Erase(owner, id);
    if (!local) continue;
    engine_.Release(*local);
    ++stats_.released;
  }
  if (o_.standby != nullptr && r.owner_token != 0) o_.standby->Released(owner, r.request_ids);
  if (r.nonce != 0) send_(r.reply_to, ReleasedSignal{r.nonce, o_.self});
}

bool StepReceiver::Evict(const OwnerKey& owner, uint64_t id) {
  std::optional<uint64_t> local = scope_.Erase(owner, id);
  if (!local) return false;
  engine_.Release(*local);
  ++stats_.released;
  if (o_.standby != nullptr) o_.standby->Released(owner, {id});
  return true;
}

void StepReceiver::DropOwner(const Lid& lid, uint64_t epoch, std::string_view why) {
  const uint64_t* gone = gone_owners_.Find(lid);
  gone_owners_.Put(lid, gone == nullptr ? epoch : std::max(*gone, epoch));
  std::vector<uint64_t> locals = scope_.EraseOwner(lid, epoch);
  for (uint64_t local : locals) engine_.Release(local);
  if (o_.standby != nullptr) o_.standby->OwnerGone(lid, epoch);
  stats_.released += locals.size();
  if (!locals.empty()) {
    CONNEX_LOG_INFO("pp {}: owner {} epoch {} {}: dropped {} requests' state", o_.self.ToString(),
                    lid.ToString(), epoch, why, locals.size());
  }
}

}  // namespace connex::pp
