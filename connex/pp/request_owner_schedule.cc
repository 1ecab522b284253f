// RequestOwner's scheduling (request_owner.h): the requests ready for a step grouped by route,
// cut into steps (scheduler.h), stage 0 run on each under an admitted epoch, and sent. Apart
// from request_owner.cc, which keeps the requests' lives: answers, ends, failover and timers.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/epoch_ledger.h"
#include "connex/pp/request_owner.h"
#include "connex/pp/route_table.h"
#include "connex/pp/scheduler.h"

namespace connex::pp {
namespace {

// Bytes a step's payload needs besides its per-token rows: the batch keys and alignment.
constexpr uint64_t kStepOverheadBytes = 4096;
// The row that sampling.history adds to every stage's output per token (when a request of the
// step has a repetition penalty), beside the engine's own.
constexpr uint64_t kHistoryBytesPerToken = sizeof(int32_t);

}  // namespace

// Tokens one step may carry so that stage 0's output fits a ring slot (see MaxStepTokens).
uint64_t RequestOwner::MaxStepTokens() const {
  const uint64_t engine = engine_.OutputBytesPerToken();
  return pp::MaxStepTokens(engine > 0 ? engine + kHistoryBytesPerToken : 0,
                           measured_bytes_per_token_, host_.payload_capacity(), kStepOverheadBytes,
                           o_.stages);
}

void RequestOwner::Schedule(int64_t now) {
  if (requests_.empty()) return;
  // The owner's own engine step runs under its epoch too: not after an eviction it missed.
  if (absl::StatusOr<uint64_t> admitted = host_.Admit(); !admitted.ok()) {
    CONNEX_LOG_DEBUG("pp {}: no step scheduled: {}", name_, AsStd(admitted.status().message()));
    return;
  }
  // Requests ready for their next step, grouped by route.
  std::map<std::string, std::vector<uint64_t>> ready;
  std::map<std::string, std::vector<Hop>> routes;
  std::vector<std::pair<uint64_t, absl::Status>> unroutable;
  std::map<std::string, Hop> handoffs;  // PD: a prefill route's decode instance
  std::map<Lid, size_t> load;           // PD: requests on each instance
  if (o_.pd) {
    for (const auto& [id, q] : requests_) {
      if (!q.route.empty()) ++load[q.route[0].lid];
      if (!q.handoff.none() && (q.route.empty() || q.route[0].lid != q.handoff.lid))
        ++load[q.handoff.lid];
    }
  }
  for (auto& [id, q] : requests_) {
    if (q.step != 0) continue;
    if (o_.pd) {
      if (!PdRoute(q, load)) {
        if (now - q.waiting_since > o_.route_wait_ms) {
          unroutable.emplace_back(id, absl::UnavailableError(StrCat(
                                          "request ", id, ": no live instance of a pool for ",
                                          o_.route_wait_ms, " ms (", host_.RouteProblem(), ")")));
        }
        continue;
      }
      for (const Hop& h : q.route) q.visited[h.lid] = h.signal;
      std::string key = RouteKey(q.route);
      if (PdPrefill(q)) {
        q.visited[q.handoff.lid] = q.handoff.signal;
        key += ">" + RouteKey({q.handoff});
        handoffs[key] = q.handoff;
      }
      ready[key].push_back(id);
      routes[key] = q.route;
      continue;
    }
    bool valid = q.route.size() == o_.stages - 1;
    for (const Hop& h : q.route) valid &= host_.Usable(h.lid, h.epoch);
    if (!valid || o_.stages == 1) {
      std::optional<std::vector<Hop>> route = host_.BuildRoute(q.route);
      if (route && q.route.size() == route->size()) {
        bool moved = false;
        for (size_t i = 0; i < route->size(); ++i) moved |= (*route)[i].lid != q.route[i].lid;
        if (moved) ++stats_.failovers;  // its next step goes to another replica
      }
      if (!route) {
        if (now - q.waiting_since > o_.route_wait_ms) {
          unroutable.emplace_back(id, absl::UnavailableError(StrCat(
                                          "request ", id, ": no live replica of some stage for ",
                                          o_.route_wait_ms, " ms (", host_.RouteProblem(), ")")));
        }
        continue;
      }
      q.route = *route;
    } else {
      // Keep the hops, refresh their epochs and addresses (a migration keeps the state).
      std::optional<std::vector<Hop>> fresh = host_.BuildRoute(q.route);
      if (fresh) q.route = *fresh;
    }
    for (const Hop& h : q.route) q.visited[h.lid] = h.signal;
    std::string key = RouteKey(q.route);
    ready[key].push_back(id);
    routes[key] = q.route;
  }
  for (auto& [id, status] : unroutable) Finish(id, status);
  if (ready.empty()) return;
  std::map<std::string, int> inflight;
  for (const auto& [id, st] : steps_) ++inflight[RouteKey(st.route)];
  StepLimits limits;
  limits.max_batch = static_cast<size_t>(o_.max_batch);
  limits.max_tokens = MaxStepTokens();
  for (auto& [key, ids] : ready) {
    if (inflight[key] >= o_.inflight) continue;
    limits.max_steps = static_cast<size_t>(o_.inflight - inflight[key]);
    std::vector<ReadyRequest> waiting;
    for (uint64_t id : ids) {
      auto q = requests_.find(id);  // a callback of an earlier Finish may have ended it
      if (q == requests_.end() || q->second.step != 0) continue;
      if (q->second.rewind && !engine_.DropState(id, static_cast<int64_t>(q->second.cached)).ok()) {
        // Stage 0's engine cannot cut back: recompute from 0 (which every stage can).
        q->second.cached = 0;
        q->second.rewind = false;
      }
      waiting.push_back(ReadyRequest{id, q->second.cached, q->second.tokens.size()});
    }
    for (PlannedStep& step : PlanSteps(waiting, limits)) {
      stats_.chunked += step.chunked;
      // An earlier step's callbacks (a single stage's tokens, an engine error) may have ended
      // some of these requests: those left wait for the next round.
      bool intact = true;
      for (uint64_t id : step.ids) {
        auto q = requests_.find(id);
        intact &= q != requests_.end() && q->second.step == 0;
      }
      if (intact) CreateStep(step.ids, step.ends, routes[key], handoffs[key]);
    }
  }
}

// Runs stage 0 of a step for `ids` (request i covers tokens [cached, ends[i])) and sends it.
bool RequestOwner::CreateStep(const std::vector<uint64_t>& ids, const std::vector<uint64_t>& ends,
                              const std::vector<Hop>& route, const Hop& handoff) {
  CONNEX_CHECK(!ids.empty() && ids.size() == ends.size());
  std::vector<int32_t> starts, counts, tokens;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto found = requests_.find(ids[i]);
    CONNEX_CHECK(found != requests_.end());  // Schedule passes running requests only
    Request& q = found->second;
    CONNEX_CHECK(q.cached < ends[i] && ends[i] <= q.tokens.size());  // PlanSteps' contract
    starts.push_back(static_cast<int32_t>(q.cached));
    counts.push_back(static_cast<int32_t>(ends[i] - q.cached));
    tokens.insert(tokens.end(), q.tokens.begin() + q.cached, q.tokens.begin() + ends[i]);
  }
  std::vector<Sampling> sampling;
  for (uint64_t id : ids) sampling.push_back(requests_[id].sampling);
  const TensorDict in = StepInput(ids, starts, counts, tokens, sampling);
  std::vector<uint64_t> missing = engine_.MissingRequests(in);
  if (!missing.empty()) {
    // This stage lost them (released): recompute from the prompt on the next round.
    for (uint64_t id : missing) requests_[id].cached = 0;
    return false;
  }
  // Admitted right before it runs (Schedule's admission may be a freeze ago), the time taken
  // first: a freeze after it is a stall that Admit sees.
  const int64_t admitted_ns = MonotonicNowNs();
  absl::StatusOr<uint64_t> epoch = host_.Admit();
  if (!epoch.ok()) {
    CONNEX_LOG_DEBUG("pp {}: step not run: {}", name_, AsStd(epoch.status().message()));
    return false;  // its requests wait for the next round
  }
  absl::StatusOr<TensorDict> out = engine_.ExecuteStep(in);
  if (!out.ok()) {
    for (uint64_t id : ids) {
      Finish(id, Annotate(out.status(), StrCat("request ", id, ": stage 0")));
    }
    return false;
  }
  ++stats_.steps_executed;
  host_.Executed(*epoch, admitted_ns);
  uint64_t step_id = next_step_++;
  if (o_.stages == 1) {
    absl::StatusOr<const Tensor*> next = out->Get(kNextTokens, DType::kI32, 1);
    if (!next.ok()) {
      for (uint64_t id : ids) Finish(id, next.status());
      return false;
    }
    auto t = (*next)->values<int32_t>();
    Step st;
    st.ids = ids;
    st.remaining = std::set<uint64_t>(ids.begin(), ids.end());
    st.ticket = rng_() | 1;
    for (size_t i = 0; i < ids.size(); ++i) {
      requests_[ids[i]].step = step_id;
      requests_[ids[i]].sent_to = ends[i];
    }
    uint64_t ticket = st.ticket;
    steps_[step_id] = std::move(st);
    ResultSignal r{
        step_id, 1, o_.self, ids, std::vector<int32_t>(t.begin(), t.end()), host_.Self().epoch,
        ticket};
    OnResult(r);
    return true;
  }
  uint64_t size = PackedSize(*out);
  measured_bytes_per_token_ =
      std::max(measured_bytes_per_token_, MeasuredBytesPerToken(*out, tokens.size()));
  if (size > host_.payload_capacity()) {
    // The engine gives no per-token figure and this step's output does not fit: recompute
    // these requests in chunks the measurement now bounds.
    CONNEX_LOG_INFO(
        "pp {}: a step of {} tokens made {} bytes (> a {}-byte slot): recomputing "
        "in chunks of at most {} tokens",
        name_, tokens.size(), size, host_.payload_capacity(), MaxStepTokens());
    for (uint64_t id : ids) {
      engine_.Release(id);
      requests_[id].cached = 0;
    }
    return false;
  }
  Step st;
  st.ids = ids;
  st.remaining = std::set<uint64_t>(ids.begin(), ids.end());
  st.starts = starts;
  st.counts = counts;
  st.route = route;
  st.handoff = handoff;
  st.ticket = rng_() | 1;
  st.output = *std::move(out);
  for (size_t i = 0; i < ids.size(); ++i) {
    Request& q = requests_[ids[i]];
    if (q.rewind) st.rewind.push_back(ids[i]);
    q.rewind = false;
    q.step = step_id;
    q.sent_to = ends[i];
    q.waiting_since = NowMs();
  }
  if (::connex::internal::LogEnabled(::connex::LogLevel::kTrace)) {
    std::string what;
    for (size_t i = 0; i < ids.size(); ++i) {
      what += StrCat(" ", ids[i], ":", starts[i], "+", counts[i]);
    }
    CONNEX_LOG_TRACE("pp {}: step {}:{}", name_, step_id, what);
  }
  Step& placed = steps_[step_id] = std::move(st);
  SendStep(step_id, placed);
  return true;
}

bool RequestOwner::PdRoute(Request& q, std::map<Lid, size_t>& load) {
  const bool prefill = PdPrefill(q);
  const Lid before = q.route.empty() ? Lid{} : q.route[0].lid;
  if (prefill) {
    const Hop* current = nullptr;
    if (q.use_retained) {
      current = q.retained ? &*q.retained : nullptr;
    } else if (!q.route.empty() && q.route[0].lid.group == kPdPrefillGroup) {
      current = &q.route[0];  // the chunks of a prefill stay where it began
    }
    std::optional<Hop> hop = host_.PdHop(kPdPrefillGroup, current, load);
    if (hop && q.use_retained && (!q.retained || hop->lid != q.retained->lid)) {
      // The retained copy went with its instance: prefill again from the start.
      q.use_retained = false;
      q.retained.reset();
      q.cached = 0;
      q.rewind = false;
      ++stats_.reprefills;
    }
    const Hop* to = q.handoff.none() ? nullptr : &q.handoff;
    std::optional<Hop> decode = host_.PdHop(kPdDecodeGroup, to, load);
    if (!hop || !decode) return false;
    // A prefill moved to another prefill instance (not a decode instance's loss going back to
    // its prefill instance's retained copy: that one counted when it was lost).
    if (q.cached > 0 && before.group == kPdPrefillGroup && before != hop->lid) ++stats_.failovers;
    q.route = {*hop};
    if (decode->lid != q.handoff.lid) ++load[decode->lid];
    q.handoff = *decode;
  } else {
    std::optional<Hop> hop = host_.PdHop(kPdDecodeGroup, &q.handoff, load);
    if (!hop) return false;
    if (hop->lid != q.handoff.lid) ++stats_.failovers;  // its decode instance went
    q.handoff = *hop;
    q.route = {*hop};
  }
  if (before != q.route[0].lid) ++load[q.route[0].lid];
  return true;
}

}  // namespace connex::pp
