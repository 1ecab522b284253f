// StageNode::Impl's loop (internal/node_impl.h): frames, peer changes and commands taken from
// the queue and dispatched to the rooms, timers, stats, and what the owner asks of the node.
#include "connex/pp/internal/node_impl.h"

namespace connex::pp {

// Two threads may run the loop, one at a time (internal/loop_baton.h): this one first; on a
// stage that reads steps, a follower takes the loop over while a read hangs.
void StageNode::Impl::Run(bool first) {
  if (first) {
    baton_.Lead();
    Lead();
  }
  while (!stop_.load() && baton_.Follow(stop_)) {
    CONNEX_LOG_INFO("pp {}: a step's read hung; the loop goes on on its other thread ({} so far)",
                    lid_.ToString(), baton_.take_overs());
    Lead();
  }
}

void StageNode::Impl::Lead() {
  CONNEX_CHECK(sender_ != nullptr && receiver_ != nullptr && guard_ != nullptr);  // Start's
  while (!stop_.load()) {
    int64_t now = NowMs();
    if (batch_.empty()) {
      int64_t wait = std::max<int64_t>(0, std::min<int64_t>(20, NextTimer(now) - now));
      batch_ = queue_.Take(absl::Milliseconds(wait));
    }
    guard_->NoteAlive();
    last_turn_ms_.store(NowMs(), std::memory_order_relaxed);
    drain_->BeforeTurn();
    while (!batch_.empty()) {
      Item item = std::move(batch_.front());
      batch_.pop_front();
      guard_->NoteAlive();
      last_turn_ms_.store(NowMs(), std::memory_order_relaxed);
      if (stop_.load()) {
        if (auto* cmd = std::get_if<Command>(&item)) {
          if (cmd->cancel) cmd->cancel();
        }
        continue;
      }
      if (auto* frame = std::get_if<std::string>(&item)) {
        HandleFrame(*frame);
        // A read that hung moved the loop to the other thread: this one follows now.
        if (!baton_.Leads()) return;
      } else if (auto* pc = std::get_if<elastic::PeerChange>(&item)) {
        HandlePeerChange(*pc);
      } else if (auto* cmd = std::get_if<Command>(&item)) {
        cmd->run();
      }
    }
    now = NowMs();
    RunTimers(now);
    sender_->Flush();
    if (kv_) kv_->Turn(now);  // after the steps: mirrors are off their critical path
    if (!held_results_.empty()) ReleaseHeldResults(now);
    if (o_.stage == 0) {
      if (!drain_->draining() && !drain_->lost()) owner_->Schedule(now);
      releases_->Flush(now, owner_->last_step(), signals_->address());
    }
    if (now - last_prune_ms_ >= kPruneEveryMs) {
      last_prune_ms_ = now;
      Prune();
    }
    // The drain gate opens once nothing of ours is in flight and no step arrived for a short
    // while (owners that had not yet seen our LEFT may still have routed one here).
    const bool idle = owner_->steps() == 0 && sender_->queued() == 0 && receiver_->reading() == 0 &&
                      sender_->awaiting_ack() == 0 && (!kv_ || kv_->in_flight() == 0) &&
                      held_results_.empty() && now - last_step_ms_ >= kDrainQuietMs;
    drain_->AfterTurn(idle);
    PublishStats();
  }
}

void StageNode::Impl::PublishStats() {
  stats_.ring_in_use = sender_ ? sender_->slots_in_use() : 0;
  stats_.backpressured = sender_ ? sender_->backpressured() : 0;
  const RequestOwnerStats& owned = owner_->stats();
  stats_.late_dropped = owned.late_dropped;
  stats_.resends = owned.resends;
  stats_.failovers = owned.failovers;
  stats_.reprefills = owned.reprefills;
  stats_.aborted = owned.aborted;
  stats_.completed = owned.completed;
  stats_.chunked = owned.chunked;
  stats_.requests_in_flight = owner_->requests();
  stats_.stalled_ms = owner_->stalled_ms(NowMs());
  stats_.steps_in_flight = owner_->steps() + (sender_ ? sender_->queued() : 0);
  if (receiver_) {
    const StepReceiverStats& r = receiver_->stats();
    stats_.steps_executed = r.steps_executed + owned.steps_executed;
    stats_.steps_replayed = r.steps_replayed;
    stats_.duplicates_dropped = r.duplicates_dropped;
    stats_.fenced = r.fenced;
    stats_.missing_reported = r.missing_reported;
    stats_.released = r.released;
    stats_.forged_dropped = r.forged_dropped + owned.forged_dropped + acks_forged_dropped_;
    stats_.strangers_ignored = strangers_ignored_;
    stats_.held_requests = receiver_->held_requests();
    stats_.replay_bytes = receiver_->replay_bytes();
    stats_.rewound = r.rewound;
  }
  stats_.lag_recomputes = owned.lag_recomputes;
  if (kv_) {
    const KvStandbyStats k = kv_->stats();
    stats_.kv_standby = o_.kv_standby;
    stats_.kv_mirrored_bytes = k.primary.bytes_sent;
    stats_.kv_mirror_updates = k.primary.updates_sent;
    stats_.kv_standby_lag = k.primary.lag;
    stats_.kv_standby_changes = k.primary.standby_changes;
    stats_.kv_mirrors_held = k.standby.mirrors;
    stats_.kv_mirror_bytes_held = k.standby.bytes;
    stats_.kv_mirrors_dropped_for_budget = k.standby.dropped_for_budget;
    stats_.kv_takeovers = k.standby.takeovers;
    stats_.kv_takeovers_lagged = k.standby.takeovers_lagged;
    stats_.kv_mirror_bytes_received = k.standby.bytes_received;
    stats_.kv_mirror_read_us = k.standby.read_ns / 1000;
    stats_.pd_handoff_updates = k.handoff_updates;
    stats_.pd_handoff_bytes = k.handoff_bytes;
    stats_.pd_retained = k.retained;
    stats_.pd_retained_bytes = k.retained_bytes;
    stats_.pd_retention_expired = k.retention_expired;
  }
  stats_.pd_handoffs = owned.pd_handoffs;
  stats_.pd_retained_resumes = owned.pd_retained_resumes;
  stats_.pd_results_held = held_results_.size();
  stats_.pd_handoff_waits_expired = handoff_waits_expired_;
  stats_.pd_handoff_results = handoff_results_;
  stats_.pd_handoff_wait_ms = handoff_wait_ms_;
  std::tie(stats_.pd_prefilling, stats_.pd_decoding) = owner_->PdPhases();
  stats_.releases_pending = releases_ ? releases_->pending() : 0;
  stats_.epoch = reg_->epoch();
  stats_.epoch_checks = guard_->stats().epoch_checks;
  stats_.steps_on_lease = guard_->stats().steps_on_lease;
  ledger_.Hold(stats_.epoch);
  stats_.epochs = ledger_.epochs();
  connex::MutexLock lock(&stats_mu_);
  stats_snapshot_ = stats_;
}

void StageNode::Impl::HandleFrame(const std::string& frame) {
  absl::StatusOr<Signal> signal = Decode(frame);
  if (!signal.ok()) {
    CONNEX_LOG_WARN("pp {}: dropped a malformed signal: {}", lid_.ToString(),
                    AsStd(signal.status().message()));
    return;
  }
  std::visit([this](auto& s) { On(s); }, *signal);
  if (!baton_.Leads()) return;  // the loop is the other thread's now (Lead)
  // After the frame was handled: a step that arrives after a silence is admitted (or not)
  // before it counts as contact (Admit, "on the lease").
  if (routes_.FromMember(*signal, lid_, last_ack_matched_)) guard_->NotePeer();
}

void StageNode::Impl::Deliver(const StepSignal& s, const TensorDict& out) {
  if (o_.stage + 1 == o_.stages) {
    absl::StatusOr<Signal> answer = LastStageAnswer(s, out, lid_, reg_->epoch());
    if (!answer.ok() || std::holds_alternative<StepErrorSignal>(*answer)) {
      CONNEX_LOG_ERROR("pp {}: the engine's last-stage output lacks {}", lid_.ToString(),
                       kNextTokens);
    }
    if (answer.ok() && !HoldForHandoff(s, *answer)) Send(s.owner.signal, *answer);
    return;
  }
  absl::StatusOr<PendingSend> next = NextHop(s, out, Self());
  if (!next.ok()) {
    CONNEX_LOG_ERROR("pp {}: {}", lid_.ToString(), AsStd(next.status().message()));
    return;
  }
  sender_->Forward(*std::move(next));
}

void StageNode::Impl::HopFailed(const Hop& owner, uint64_t step, uint32_t attempt, uint64_t ticket,
                                uint32_t hop, absl::StatusCode code, const std::string& reason) {
  HopFailedSignal f{step,   attempt,       lid_,  hop, static_cast<uint32_t>(code),
                    reason, reg_->epoch(), ticket};
  if (owner.lid == lid_) {
    CONNEX_CHECK(o_.stage == 0);  // only stage 0 sends steps it owns
    owner_->OnHopFailed(f);
  } else {
    Send(owner.signal, f);
  }
}

void StageNode::Impl::On(ReleaseSignal& r) {
  // An owner's RELEASE that is not believed is re-sent until acknowledged (ReleaseQueue), so
  // one that arrives before this node has seen the owner join is only late, not lost.
  if (!KnownMember(r.from, r.reply_to)) {
    ++strangers_ignored_;
    return;
  }
  receiver_->OnRelease(r);
}

void StageNode::Impl::On(PingSignal& p) {
  if (!KnownMember(p.from, p.reply_to)) {
    ++strangers_ignored_;
    return;
  }
  Send(p.reply_to, PongSignal{p.nonce, lid_, reg_->epoch()});
}

void StageNode::Impl::On(MirrorSignal& m) {
  // Only a live or draining member of our stage mirrors here, at its own signal address (PD: a
  // decode instance takes the handoffs of prefill instances too).
  const bool pool = m.origin.lid.group == lid_.group ||
                    (o_.pd_role == PdRole::kDecode && m.origin.lid.group == kPdPrefillGroup);
  if (!routes_.IsMemberSignal(m.origin.lid, m.origin.signal) || !pool) {
    ++strangers_ignored_;
    return;
  }
  if (!kv_) {
    MirroredSignal r;
    r.corr = m.corr;
    r.from = lid_;
    r.code = static_cast<uint32_t>(absl::StatusCode::kUnimplemented);
    r.message = StrCat(lid_.ToString(), ": no KV standby here (CONNEX_PP_KV_STANDBY=off)");
    Send(m.origin.signal, r);
    return;
  }
  kv_->OnMirror(m, reg_->epoch(), NowMs());
}

void StageNode::Impl::HandlePeerChange(const elastic::PeerChange& c) {
  const Lid& lid = c.record.lid;
  const bool owner = lid.group == 0 && o_.stage != 0;
  if (kv_ && lid.group == lid_.group && lid != lid_) {
    // A member of our own stage: our standby may change; a failed primary's mirrors wait for
    // the re-sent steps a grace period.
    if (c.kind == elastic::PeerChange::Kind::kFailed)
      kv_->PrimaryGone(lid, c.record.epoch, NowMs());
    ChooseStandby();
  }
  if (kv_ && c.kind == elastic::PeerChange::Kind::kFailed && o_.pd_role != PdRole::kNone) {
    // PD: a prefill instance that failed leaves its handoffs here for the owners' next steps; a
    // decode instance that failed takes no more handoffs.
    if (o_.pd_role == PdRole::kDecode && lid.group == kPdPrefillGroup)
      kv_->PrimaryGone(lid, c.record.epoch, NowMs());
    if (o_.pd_role == PdRole::kPrefill && lid.group == kPdDecodeGroup) kv_->HandoffTargetGone(lid);
  }
  switch (c.kind) {
    case elastic::PeerChange::Kind::kFailed:
      if (owner) receiver_->OwnerFailed(lid, c.record.epoch);
      PeerGone(lid, c.record.epoch, c.reason.empty() ? "FAILED" : c.reason);
      // Its socket is not needed any more (a restart under the LID has a new address).
      signals_->Forget(HopFromRecord(c.record).signal);
      break;
    case elastic::PeerChange::Kind::kLeft:
      if (owner) receiver_->OwnerLeft(lid, c.record.epoch, NowMs() + o_.owner_grace_ms);
      break;
    case elastic::PeerChange::Kind::kSuspected:
      CONNEX_LOG_INFO("pp {}: {} suspected ({})", lid_.ToString(), lid.ToString(), c.reason);
      break;  // only a suspicion: the step timeout and the probe decide
    case elastic::PeerChange::Kind::kJoined:
      if (owner) receiver_->OwnerJoined(lid, c.record.epoch);
      break;
    case elastic::PeerChange::Kind::kMigrated:
      // A migrated hop keeps its state: steps fenced at the old epoch come back as
      // HOP_FAILED and are re-sent along the refreshed route.
      break;
  }
}

void StageNode::Impl::PeerGone(const Lid& lid, uint64_t epoch, const std::string& why) {
  if (lid == lid_) return;
  if (!gone_peers_.Insert({lid, epoch})) return;
  CONNEX_LOG_INFO("pp {}: {} epoch {} is gone ({})", lid_.ToString(), lid.ToString(), epoch, why);
  // Slots waiting for the dead peer's acknowledgement are free; its steps fail over.
  sender_->PeerGone(lid, why);
  if (o_.stage != 0) return;
  owner_->PeerGone(lid, epoch, why);
}

void StageNode::Impl::RunTimers(int64_t now) {
  // Unacknowledged slots: give them up (the header check stops a late reader).
  sender_->Expire(now);
  if (o_.stage != 0) return;
  owner_->RunTimers(now);
}

// ---- PD (pd.h) ----

bool StageNode::Impl::HoldForHandoff(const StepSignal& s, const Signal& answer) {
  if (o_.pd_role != PdRole::kPrefill || !s.has_handoff() || !kv_ ||
      !std::holds_alternative<ResultSignal>(answer)) {
    return false;
  }
  HeldResult h;
  h.address = s.owner.signal;
  h.answer = answer;
  h.owner = OwnerKey{s.owner.lid, s.owner_token};
  h.target = s.handoff.lid;
  for (size_t i = 0; i < s.request_ids.size(); ++i) {
    h.needs.emplace_back(s.request_ids[i],
                         int64_t{s.start_positions[i]} + int64_t{s.num_tokens[i]});
  }
  h.held_at = NowMs();
  // Never past half the step timeout: an owner that waited longer would re-send the step (and
  // a handoff that cannot finish would hold every attempt's answer back).
  h.deadline = h.held_at + std::min(o_.pd_handoff_wait_ms, o_.step_timeout_ms / 2);
  held_results_.push_back(std::move(h));
  return true;
}

void StageNode::Impl::ReleaseHeldResults(int64_t now) {
  for (auto it = held_results_.begin(); it != held_results_.end();) {
    bool ready = true;
    for (const auto& [id, positions] : it->needs) {
      std::optional<int64_t> confirmed = kv_->HandedOver(it->owner, id);
      // Not tracked (released, its target gone) or dropped for the decode side's budget: the
      // owner's next step finds out what the decode instance holds.
      if (confirmed && *confirmed >= 0 && *confirmed < positions) ready = false;
    }
    if (!ready && it->deadline > now) {
      ++it;
      continue;
    }
    if (!ready) ++handoff_waits_expired_;
    ++handoff_results_;
    handoff_wait_ms_ += static_cast<uint64_t>(std::max<int64_t>(0, now - it->held_at));
    Send(it->address, it->answer);
    it = held_results_.erase(it);
  }
}

void StageNode::Impl::ExpireRetained(int64_t now) {
  if (o_.pd_role != PdRole::kPrefill || !kv_) return;
  for (const auto& [owner, id] : kv_->RetentionExpired(now, o_.pd_retain_ms, o_.pd_retain_bytes)) {
    if (!receiver_->Evict(owner, id)) kv_->Released(owner, {id});
  }
}

}  // namespace connex::pp
