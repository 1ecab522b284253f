#include "connex/pp/request_owner.h"

#include <algorithm>
#include <utility>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/internal/batch_select.h"

namespace connex::pp {
namespace {

// Errors of a hop that no re-send can cure: the step itself does not fit or is malformed.
bool Permanent(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kOutOfRange;
}

}  // namespace

RequestOwner::RequestOwner(RequestOwnerOptions options, Engine& engine, OwnerHost& host)
    : o_(std::move(options)),
      name_(o_.self.ToString()),
      clock_(o_.clock != nullptr ? o_.clock : RealClock::Get()),
      engine_(engine),
      host_(host),
      rng_(o_.seed),
      next_step_(o_.first_step) {}

absl::Status RequestOwner::Add(uint64_t id, std::vector<int32_t> prompt, int max_new,
                               Completion done, TokenCallback on_token, Sampling sampling,
                               int64_t timeout_ms, StopTokens stop) {
  CONNEX_CHECK(!prompt.empty() && max_new > 0 && timeout_ms >= 0);  // the node validated them
  if (requests_.count(id)) {
    return absl::InvalidArgumentError(StrCat("request ", id, " is already running"));
  }
  Request r;
  r.tokens = std::move(prompt);
  r.prompt_len = r.tokens.size();
  r.max_new = max_new;
  r.done = std::move(done);
  r.on_token = std::move(on_token);
  r.sampling = sampling;
  r.stop = std::move(stop);
  r.waiting_since = NowMs();
  int64_t timeout = timeout_ms > 0 ? timeout_ms : o_.request_timeout_ms;
  r.timeout_ms = timeout;
  r.deadline = timeout > 0 ? NowMs() + timeout : 0;
  if (requests_.empty()) last_progress_ms_ = NowMs();  // the stall clock starts with work
  requests_.emplace(id, std::move(r));
  return absl::OkStatus();
}

RequestOwner::Request& RequestOwner::Get(uint64_t id) {
  auto it = requests_.find(id);
  CONNEX_CHECK(it != requests_.end());
  return it->second;
}

// ---- answers ----

// Whether an answer about step `st` really comes from the hop it claims: the LID and epoch
// of a hop of the step's current route (the last one for a RESULT), and the attempt's ticket.
bool RequestOwner::Believe(const Step& st, const Lid& from, uint64_t from_epoch, uint64_t ticket,
                           bool last_only) const {
  if (ticket != st.ticket) return false;
  if (st.route.empty()) return from == o_.self;
  if (last_only) return st.route.back().lid == from && st.route.back().epoch == from_epoch;
  for (const Hop& h : st.route) {
    if (h.lid == from && h.epoch == from_epoch) return true;
  }
  return from == o_.self;
}

void RequestOwner::OnResult(const ResultSignal& r) {
  // Decode checks it of a RESULT from the wire; CreateStep of its own.
  CONNEX_CHECK(r.tokens.size() == r.request_ids.size());
  auto it = steps_.find(r.step);
  if (it == steps_.end() || it->second.attempt != r.attempt) {
    ++stats_.late_dropped;
    return;
  }
  if (!Believe(it->second, r.from, r.from_epoch, r.ticket, /*last_only=*/true)) {
    ++stats_.forged_dropped;
    CONNEX_LOG_WARN("pp {}: dropped a RESULT of step {} from {} epoch {}: not the step's last hop",
                    name_, r.step, r.from.ToString(), r.from_epoch);
    return;
  }
  last_progress_ms_ = NowMs();
  for (size_t i = 0; i < r.request_ids.size(); ++i) {
    uint64_t id = r.request_ids[i];
    // Looked up afresh: a callback below may end other requests of this step (a cancel from
    // on_token), and with the last of them the step itself.
    auto step = steps_.find(r.step);
    if (step == steps_.end()) break;  // every request still in it has ended
    if (!step->second.remaining.erase(id)) continue;
    auto req = requests_.find(id);
    if (req == requests_.end()) continue;
    Request& q = req->second;
    q.step = 0;
    if (!step->second.handoff.none()) {
      // PD: its prefill instance holds (and retains) its state up to here, handed over.
      q.retained = step->second.route[0];
      q.retained_positions = q.sent_to;
      q.use_retained = false;
      if (q.sent_to == q.tokens.size()) ++stats_.pd_handoffs;
    }
    if (q.sent_to < q.tokens.size()) {
      // A chunk of a longer prefill: the token sampled after it is not wanted.
      q.cached = q.sent_to;
      continue;
    }
    CONNEX_LOG_TRACE("pp {}: step {} attempt {}: request {} token {} from {}", name_, r.step,
                     r.attempt, id, r.tokens[i], r.from.ToString());
    q.cached = q.tokens.size();
    q.tokens.push_back(r.tokens[i]);
    const size_t generated = q.tokens.size() - q.prompt_len;
    const bool last =
        static_cast<int>(generated) >= q.max_new || q.stop.Stops(r.tokens[i], o_.eos_token);
    if (q.on_token) q.on_token(id, r.tokens[i]);  // may Cancel the request: `q` is gone then
    if (last && requests_.count(id)) Finish(id, absl::OkStatus());
  }
  EraseStepIfDone(r.step);
}

void RequestOwner::OnMissing(const MissingSignal& m) {
  auto it = steps_.find(m.step);
  if (it == steps_.end() || it->second.attempt != m.attempt) {
    ++stats_.late_dropped;
    return;
  }
  Step& st = it->second;
  if (!Believe(st, m.from, m.from_epoch, m.ticket, /*last_only=*/false)) {
    ++stats_.forged_dropped;
    return;
  }
  for (size_t i = 0; i < m.request_ids.size(); ++i) {
    const uint64_t id = m.request_ids[i];
    if (!st.remaining.erase(id)) continue;
    auto req = requests_.find(id);
    if (req == requests_.end()) continue;
    Request& q = req->second;
    q.step = 0;
    // A standby that took the request over holds its first `held` positions (short of the
    // step): only the rest is recomputed, every stage cutting back to it. Else re-prefill
    // prompt + generated along the route.
    const int64_t held = i < m.held.size() ? m.held[i] : 0;
    if (held > 0 && static_cast<size_t>(held) <= q.cached) {
      q.cached = static_cast<size_t>(held);
      q.rewind = true;
      ++stats_.lag_recomputes;
    } else if (o_.pd && m.from.group == kPdDecodeGroup && q.retained && q.retained_positions > 0 &&
               q.retained_positions < q.tokens.size() &&
               host_.Usable(q.retained->lid, q.retained->epoch)) {
      // PD: the decode instance lost it; its prefill instance retains the first positions and
      // hands them (with what it recomputes beyond) to a decode instance picked afresh.
      q.cached = q.retained_positions;
      q.use_retained = true;
      q.rewind = true;
      q.handoff = Hop{};
      ++stats_.pd_retained_resumes;
    } else {
      if (q.use_retained) q.retained.reset();  // the prefill instance no longer holds it
      q.use_retained = false;
      q.cached = 0;
      q.rewind = false;
      ++stats_.reprefills;
    }
    ++q.reprefills;
    if (q.reprefills > o_.reprefill_max) {
      Finish(id,
             absl::AbortedError(StrCat("request ", id, ": aborted after ", q.reprefills - 1,
                                       " failovers (CONNEX_PP_REPREFILL_MAX=", o_.reprefill_max,
                                       "); last: ", m.from.ToString(), " did not hold its state")));
    }
  }
  EraseStepIfDone(m.step);
}

void RequestOwner::OnStepError(const StepErrorSignal& e) {
  auto it = steps_.find(e.step);
  if (it == steps_.end() || it->second.attempt != e.attempt) {
    ++stats_.late_dropped;
    return;
  }
  if (!Believe(it->second, e.from, e.from_epoch, e.ticket, /*last_only=*/false)) {
    ++stats_.forged_dropped;
    return;
  }
  absl::StatusCode code = static_cast<absl::StatusCode>(e.code);
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
  std::vector<uint64_t> ids;
  for (uint64_t id : e.request_ids) {
    if (it->second.remaining.count(id)) ids.push_back(id);
  }
  for (uint64_t id : ids) {  // Finish may erase the step
    Finish(id, absl::Status(code, StrCat("request ", id, ": stage ", e.from.group,
                                         " failed the step: ", e.message)));
  }
}

void RequestOwner::OnHopFailed(const HopFailedSignal& f) {
  auto it = steps_.find(f.step);
  if (it == steps_.end() || it->second.attempt != f.attempt) return;
  Step& st = it->second;
  if (!Believe(st, f.from, f.from_epoch, f.ticket, /*last_only=*/false)) {
    ++stats_.forged_dropped;
    return;
  }
  if (Permanent(static_cast<absl::StatusCode>(f.code))) {
    // No re-send can cure it (the step does not fit, or is refused as malformed).
    std::vector<uint64_t> ids(st.remaining.begin(), st.remaining.end());
    for (uint64_t id : ids) {
      Finish(id, absl::Status(static_cast<absl::StatusCode>(f.code),
                              StrCat("request ", id, ": step to stage ", f.hop + 1,
                                     " cannot be delivered: ", f.reason)));
    }
    return;
  }
  if (st.resend_at > 0) return;
  st.last_problem = f.reason;
  if (static_cast<absl::StatusCode>(f.code) == absl::StatusCode::kDeadlineExceeded) {
    // The hop never acknowledged within a step timeout (a host gone without a FIN, a frozen
    // process): probe the route now, as a step timeout does, so that a silent hop is declared
    // failed and the step re-routed — not re-sent to the same silent hop until the directory's
    // lease runs out.
    if (st.probe_until == 0) st.deadline = NowMs();
    CONNEX_LOG_DEBUG("pp {}: step {} attempt {}: hop {} did not acknowledge: probing", name_,
                     f.step, f.attempt, f.hop);
    return;
  }
  // Back off a little so that a peer whose death is not known yet does not spin the step.
  st.resend_at = NowMs() + std::min<int64_t>(200, 5 << std::min<uint32_t>(st.attempt, 5));
  CONNEX_LOG_DEBUG("pp {}: step {} attempt {}: hop {} failed: {}", name_, f.step, f.attempt, f.hop,
                   f.reason);
}

void RequestOwner::OnPong(const PongSignal& p) {
  auto it = pings_.find(p.nonce);
  if (it == pings_.end()) return;
  auto [step_id, expected] = it->second;
  pings_.erase(it);
  if (expected != p.from) {
    ++stats_.forged_dropped;
    return;
  }
  auto st = steps_.find(step_id);
  if (st != steps_.end()) st->second.ponged.insert(p.from);
}

// ---- ends ----

void RequestOwner::EraseStepIfDone(uint64_t step_id) {
  auto it = steps_.find(step_id);
  if (it == steps_.end() || !it->second.remaining.empty()) return;
  for (uint64_t nonce : it->second.pings) pings_.erase(nonce);
  steps_.erase(it);
}

void RequestOwner::Finish(uint64_t id, absl::Status status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request q = std::move(it->second);
  requests_.erase(it);
  if (q.step != 0) {
    auto st = steps_.find(q.step);
    if (st != steps_.end()) {
      st->second.remaining.erase(id);
      EraseStepIfDone(q.step);
    }
  }
  engine_.Release(id);
  host_.Release(id, q.visited);
  // What led to this outcome (re-prefills, failovers, ...) is in stats() before the caller
  // hears of it: a caller that reads stats() after its request ended sees them.
  if (status.ok()) {
    ++stats_.completed;
    host_.PublishStats();
    if (q.done) q.done(id, std::vector<int32_t>(q.tokens.begin() + q.prompt_len, q.tokens.end()));
  } else {
    ++stats_.aborted;
    if (status.code() == absl::StatusCode::kCancelled) {
      CONNEX_LOG_INFO("pp {}: request {} cancelled: {}", name_, id, AsStd(status.message()));
    } else {
      CONNEX_LOG_WARN("pp {}: {}", name_, AsStd(status.message()));
    }
    host_.PublishStats();
    if (q.done) q.done(id, status);
  }
}

size_t RequestOwner::FinishAll(const absl::Status& status) {
  std::vector<uint64_t> ids;
  for (const auto& [id, q] : requests_) ids.push_back(id);
  for (uint64_t id : ids) Finish(id, status);
  return ids.size();
}

void RequestOwner::DropAll(const absl::Status& status) {
  for (auto& [id, r] : requests_) {
    if (r.done) r.done(id, status);
  }
  requests_.clear();
}

// ---- failover ----

void RequestOwner::PeerGone(const Lid& lid, uint64_t epoch, const std::string& why) {
  std::vector<uint64_t> affected;
  for (const auto& [id, st] : steps_) {
    for (const Hop& h : st.route) {
      if (h.lid == lid && h.epoch == epoch) {
        affected.push_back(id);
        break;
      }
    }
  }
  for (uint64_t id : affected) Resend(id, why);
}

void RequestOwner::Resend(uint64_t step_id, const std::string& why) {
  auto it = steps_.find(step_id);
  if (it == steps_.end()) return;
  Step& st = it->second;
  ++st.attempt;
  st.ticket = rng_() | 1;
  ++stats_.resends;
  st.probe_until = 0;
  st.ponged.clear();
  for (uint64_t nonce : st.pings) pings_.erase(nonce);
  st.pings.clear();
  st.resend_at = 0;
  st.last_problem = why;
  if (st.attempt > static_cast<uint32_t>(o_.attempt_max)) {
    std::vector<uint64_t> ids(st.remaining.begin(), st.remaining.end());
    for (uint64_t id : ids) {
      Finish(id, absl::UnavailableError(StrCat("request ", id, ": step sent ", st.attempt - 1,
                                               " times without a result (CONNEX_PP_ATTEMPT_MAX=",
                                               o_.attempt_max, "); last: ", why)));
    }
    return;
  }
  std::optional<std::vector<Hop>> route = host_.BuildRoute(st.route);
  if (!route) {
    st.resend_at = NowMs() + 50;  // wait for a replica to appear
    st.deadline = NowMs() + o_.step_timeout_ms;
    --st.attempt;  // waiting for a route is not a send
    CheckRouteWait(st);
    return;
  }
  CONNEX_CHECK(route->size() == st.route.size());  // one hop per stage 1..N-1, both
  bool moved = false;
  for (size_t i = 0; i < route->size(); ++i) moved |= (*route)[i].lid != st.route[i].lid;
  if (moved) {
    stats_.failovers += st.remaining.size();
    CONNEX_LOG_INFO("pp {}: step {} attempt {} re-routed ({})", name_, step_id, st.attempt, why);
  }
  st.route = *route;
  if (!st.handoff.none()) {
    // PD: the decode instance as it is now (a new epoch after a rejoin takes handoffs again),
    // or another one if it went.
    std::optional<Hop> to = host_.PdHop(kPdDecodeGroup, &st.handoff, {});
    if (to) st.handoff = *to;
  }
  for (uint64_t id : st.remaining) {
    auto req = requests_.find(id);
    if (req == requests_.end()) continue;
    req->second.route = *route;
    for (const Hop& h : *route) req->second.visited[h.lid] = h.signal;
    if (!st.handoff.none()) {
      req->second.handoff = st.handoff;
      req->second.visited[st.handoff.lid] = st.handoff.signal;
    }
  }
  SendStep(step_id, st);
}

void RequestOwner::CheckRouteWait(Step& st) {
  for (uint64_t id : std::vector<uint64_t>(st.remaining.begin(), st.remaining.end())) {
    auto req = requests_.find(id);
    if (req == requests_.end()) continue;
    if (NowMs() - req->second.waiting_since > o_.route_wait_ms) {
      Finish(id,
             absl::UnavailableError(StrCat("request ", id, ": no live replica of some stage for ",
                                           o_.route_wait_ms, " ms (", host_.RouteProblem(), ")")));
    }
  }
}

void RequestOwner::SendStep(uint64_t step_id, Step& st) {
  CONNEX_CHECK(st.starts.size() == st.ids.size() && st.counts.size() == st.ids.size());
  PendingSend p;
  StepSignal& s = p.signal;
  s.step = step_id;
  s.attempt = st.attempt;
  s.ticket = st.ticket;
  s.owner_token = o_.owner_token;
  s.owner = host_.Self();
  s.origin = host_.Self();
  s.hop = 0;
  s.route = st.route;
  s.handoff = st.handoff;
  // Only the requests the owner still waits for: the others were answered or moved to a
  // re-prefill, and must not be run again.
  std::vector<bool> keep;
  for (size_t i = 0; i < st.ids.size(); ++i) {
    keep.push_back(st.remaining.count(st.ids[i]) > 0);
    if (!keep.back()) continue;
    s.request_ids.push_back(st.ids[i]);
    s.start_positions.push_back(st.starts[i]);
    s.num_tokens.push_back(st.counts[i]);
  }
  for (uint64_t id : st.rewind) {
    if (st.remaining.count(id)) s.rewind.push_back(id);
  }
  Batch batch{st.ids, st.starts, st.counts};
  p.payload =
      s.request_ids.size() == st.ids.size() ? st.output : internal::Select(st.output, batch, keep);
  st.deadline = NowMs() + o_.step_timeout_ms;
  st.sent = true;
  host_.Forward(std::move(p));
}

// ---- timers ----

int64_t RequestOwner::NextTimer(int64_t next) const {
  for (const auto& [id, st] : steps_) {
    next = std::min(next, st.probe_until > 0 ? st.probe_until : st.deadline);
    if (st.resend_at > 0) next = std::min(next, st.resend_at);
  }
  return next;
}

void RequestOwner::RunTimers(int64_t now) {
  // Requests past their deadline end, whatever they wait for.
  std::vector<uint64_t> late;
  for (const auto& [id, q] : requests_) {
    if (q.deadline > 0 && q.deadline <= now) late.push_back(id);
  }
  for (uint64_t id : late) {
    auto late_request = requests_.find(id);
    if (late_request == requests_.end()) continue;  // ended by an earlier one's callback
    const Request& q = late_request->second;
    std::string where = "waiting to be scheduled";
    if (q.step != 0) {
      auto st = steps_.find(q.step);
      if (st != steps_.end()) {
        where = StrCat("step ", q.step, " attempt ", st->second.attempt,
                       st->second.last_problem.empty() ? "" : ", last: ", st->second.last_problem);
      }
    }
    Finish(id, absl::DeadlineExceededError(StrCat("request ", id, ": not finished within ",
                                                  q.timeout_ms, " ms (", where, ")")));
  }
  std::vector<std::pair<uint64_t, std::string>> resend;
  // Hops that did not answer a finished probe, and the probed steps. They are acted on after
  // this loop: PeerGone re-sends (re-routes) steps, which rewrites the very routes this loop
  // walks — acting inside it reported (and declared dead) hops of the *new* route instead
  // of the silent one (campaign seed 198).
  std::set<std::pair<Lid, uint64_t>> silent;
  std::vector<uint64_t> probed;
  for (auto& [id, st] : steps_) {
    if (st.resend_at > 0 && st.resend_at <= now) {
      resend.emplace_back(id, st.last_problem.empty() ? "hop failed" : st.last_problem);
      continue;
    }
    if (st.probe_until > 0) {
      if (st.probe_until > now) continue;
      // The probe is over: a hop that did not answer is dead.
      for (const Hop& h : st.route) {
        if (!st.ponged.count(h.lid)) silent.emplace(h.lid, h.epoch);
      }
      for (uint64_t nonce : st.pings) pings_.erase(nonce);
      st.pings.clear();
      probed.push_back(id);
      continue;
    }
    if (st.deadline <= now) {
      st.probe_until = now + o_.probe_timeout_ms;
      st.ponged.clear();
      const std::string reply_to = host_.Self().signal;
      for (const Hop& h : st.route) {
        uint64_t nonce = rng_() | 1;
        pings_[nonce] = {id, h.lid};
        st.pings.push_back(nonce);
        host_.Send(h.signal, PingSignal{nonce, o_.self, reply_to});
      }
    }
  }
  for (const auto& [lid, epoch] : silent) {
    CONNEX_LOG_INFO("pp {}: {} epoch {} did not answer a probe after a step timeout", name_,
                    lid.ToString(), epoch);
    host_.MarkFailed(lid, epoch);
  }
  for (uint64_t id : probed) {
    // Not re-sent by PeerGone already (every hop answered: the step itself was lost).
    auto it = steps_.find(id);
    if (it != steps_.end() && it->second.probe_until > 0) resend.emplace_back(id, "step timeout");
  }
  for (auto& [id, why] : resend) Resend(id, why);
}

}  // namespace connex::pp
