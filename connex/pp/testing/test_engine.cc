#include "connex/pp/testing/test_engine.h"

#include "connex/base/strings.h"

namespace connex::pp::testing {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

TestEngine::TestEngine(uint32_t stage, uint32_t stages, int32_t vocab)
    : stage_(stage), stages_(stages), vocab_(vocab) {}

std::vector<uint64_t> TestEngine::MissingLocked(const Batch& batch) const {
  std::vector<uint64_t> missing;
  for (size_t i = 0; i < batch.request_ids.size(); ++i) {
    if (batch.start_positions[i] == 0) continue;
    auto it = states_.find(batch.request_ids[i]);
    if (it == states_.end() || it->second.positions() < batch.start_positions[i]) {
      missing.push_back(batch.request_ids[i]);
    }
  }
  return missing;
}

std::vector<uint64_t> TestEngine::MissingRequests(const TensorDict& in) const {
  absl::StatusOr<Batch> batch = GetBatch(in);
  if (!batch.ok()) return {};
  connex::MutexLock lock(&mu_);
  if (amnesiac_) {
    std::vector<uint64_t> all;
    for (size_t i = 0; i < batch->request_ids.size(); ++i) {
      if (batch->start_positions[i] != 0) all.push_back(batch->request_ids[i]);
    }
    return all;
  }
  return MissingLocked(*batch);
}

absl::StatusOr<TensorDict> TestEngine::ExecuteStep(const TensorDict& in) {
  absl::StatusOr<Batch> batch = GetBatch(in);
  if (!batch.ok()) return batch.status();
  int64_t n = 0;
  for (int32_t c : batch->num_tokens) n += c;
  const bool first = stage_ == 0;
  const bool last = stage_ + 1 == stages_;
  absl::StatusOr<const Tensor*> input =
      first ? in.Get(kTokens, DType::kI32, 1) : in.Get("hidden", DType::kI64, 1);
  if (!input.ok()) return input.status();
  if ((*input)->shape[0] != n) {
    return absl::InvalidArgumentError(StrCat("input has ", (*input)->shape[0], " rows, batch ", n));
  }
  connex::MutexLock lock(&mu_);
  if (fail_steps_ > 0) {
    --fail_steps_;
    return absl::InternalError(StrCat("test engine: injected failure at stage ", stage_));
  }
  if (amnesiac_) {
    for (size_t i = 0; i < batch->request_ids.size(); ++i) {
      if (batch->start_positions[i] != 0) states_.erase(batch->request_ids[i]);
    }
  }
  std::vector<uint64_t> missing = MissingLocked(*batch);
  if (!missing.empty()) {
    return absl::NotFoundError(
        StrCat("stage ", stage_, " does not hold ", missing.size(), " requests"));
  }
  for (size_t i = 0; i < batch->request_ids.size(); ++i) {
    auto it = states_.find(batch->request_ids[i]);
    if (batch->start_positions[i] != 0 && it != states_.end() &&
        it->second.positions() > batch->start_positions[i]) {
      violations_.push_back(StrCat("stage ", stage_, " request ", batch->request_ids[i],
                                   ": step at position ", batch->start_positions[i], " but ",
                                   it->second.positions(), " positions are held (executed twice)"));
    }
  }
  ++executions_;
  std::vector<int64_t> hidden;
  std::vector<int32_t> next;
  int64_t row = 0;
  for (size_t i = 0; i < batch->request_ids.size(); ++i) {
    State& s = states_[batch->request_ids[i]];
    s.chain.resize(static_cast<size_t>(batch->start_positions[i]));
    uint64_t out = 0;
    for (int32_t t = 0; t < batch->num_tokens[i]; ++t, ++row) {
      uint64_t v = first ? static_cast<uint64_t>((*input)->values<int32_t>()[row])
                         : static_cast<uint64_t>((*input)->values<int64_t>()[row]);
      const uint64_t hash = Mix(s.chain.empty() ? Mix(stage_, 17) : s.chain.back(), v);
      s.chain.push_back(hash);
      out = Mix(hash, 1000 + stage_);
      hidden.push_back(static_cast<int64_t>(out));
    }
    next.push_back(static_cast<int32_t>(out % static_cast<uint64_t>(vocab_)));
  }
  TensorDict result;
  SetBatch(result, batch->request_ids, batch->start_positions, batch->num_tokens);
  if (last) {
    result.Set(kNextTokens, Tensor::Of<int32_t>({static_cast<int64_t>(next.size())}, next));
    if (logits_width_ > 0) {
      const int64_t b = static_cast<int64_t>(next.size());
      const int64_t w = logits_width_;
      std::vector<float> logits(static_cast<size_t>(b * w), 0.0f);
      for (int64_t i = 0; i < b; ++i) logits[static_cast<size_t>(i * w + next[i] % w)] = 1.0f;
      result.Set("logits", Tensor::Of<float>({b, w}, logits));
    }
  } else {
    result.Set("hidden", Tensor::Of<int64_t>({n}, hidden));
  }
  return result;
}

bool TestEngine::HoldsRequest(uint64_t id) const {
  connex::MutexLock lock(&mu_);
  return states_.count(id) > 0;
}

void TestEngine::Release(uint64_t id) {
  connex::MutexLock lock(&mu_);
  states_.erase(id);
}

uint64_t TestEngine::OutputBytesPerToken() const {
  connex::MutexLock lock(&mu_);
  return stage_ + 1 == stages_ ? 0 : bytes_per_token_;
}

size_t TestEngine::held_requests() const {
  connex::MutexLock lock(&mu_);
  return states_.size();
}

void TestEngine::SetOutputBytesPerToken(uint64_t bytes) {
  connex::MutexLock lock(&mu_);
  bytes_per_token_ = bytes;
}

void TestEngine::FailNextSteps(int n) {
  connex::MutexLock lock(&mu_);
  fail_steps_ = n;
}

void TestEngine::SetEmitLogits(int32_t width) {
  connex::MutexLock lock(&mu_);
  logits_width_ = width;
}

std::vector<std::string> TestEngine::violations() const {
  connex::MutexLock lock(&mu_);
  return violations_;
}

uint64_t TestEngine::executions() const {
  connex::MutexLock lock(&mu_);
  return executions_;
}

void TestEngine::SetAmnesiac(bool amnesiac) {
  connex::MutexLock lock(&mu_);
  amnesiac_ = amnesiac;
}

bool TestEngine::ExportsState() const {
  connex::MutexLock lock(&mu_);
  return exports_;
}

int64_t TestEngine::HeldPositions(uint64_t id) const {
  connex::MutexLock lock(&mu_);
  auto it = states_.find(id);
  return it == states_.end() ? 0 : it->second.positions();
}

absl::StatusOr<TensorDict> TestEngine::ExportState(uint64_t id, int64_t from, int64_t to) const {
  connex::MutexLock lock(&mu_);
  if (!exports_) return Engine::ExportState(id, from, to);
  auto it = states_.find(id);
  const int64_t held = it == states_.end() ? 0 : it->second.positions();
  if (from < 0 || from >= to || to > held) {
    return absl::OutOfRangeError(StrCat("test engine: request ", id, ": positions [", from, ", ",
                                        to, ") of ", held, " held"));
  }
  std::vector<int64_t> rows(it->second.chain.begin() + from, it->second.chain.begin() + to);
  TensorDict out;
  out.Set("hash", Tensor::Of<int64_t>({to - from}, rows));
  return out;
}

absl::Status TestEngine::ImportState(uint64_t id, int64_t from, const TensorDict& state) {
  absl::StatusOr<const Tensor*> rows = state.Get("hash", DType::kI64, 1);
  if (!rows.ok()) return rows.status();
  connex::MutexLock lock(&mu_);
  if (!exports_) return Engine::ImportState(id, from, state);
  auto it = states_.find(id);
  const int64_t held = it == states_.end() ? 0 : it->second.positions();
  if (from != 0 && from != held) {
    return absl::FailedPreconditionError(StrCat("test engine: request ", id, ": import at ", from,
                                                " but ", held, " positions are held"));
  }
  State& s = states_[id];
  s.chain.resize(static_cast<size_t>(from));
  for (int64_t v : (*rows)->values<int64_t>()) s.chain.push_back(static_cast<uint64_t>(v));
  imported_ += static_cast<uint64_t>((*rows)->shape[0]);
  return absl::OkStatus();
}

absl::Status TestEngine::DropState(uint64_t id, int64_t from) {
  connex::MutexLock lock(&mu_);
  if (from == 0) {
    states_.erase(id);
    return absl::OkStatus();
  }
  if (!exports_) {
    return absl::UnimplementedError(StrCat("test engine: cannot cut request ", id, " back"));
  }
  auto it = states_.find(id);
  if (it != states_.end() && it->second.positions() > from) {
    it->second.chain.resize(static_cast<size_t>(from));
  }
  return absl::OkStatus();
}

void TestEngine::SetExportsState(bool exports) {
  connex::MutexLock lock(&mu_);
  exports_ = exports;
}

uint64_t TestEngine::imported_positions() const {
  connex::MutexLock lock(&mu_);
  return imported_;
}

std::vector<int32_t> ReferenceTokens(uint32_t stages, const std::vector<int32_t>& prompt,
                                     int max_new_tokens, int32_t vocab) {
  std::vector<std::unique_ptr<TestEngine>> engines;
  for (uint32_t s = 0; s < stages; ++s)
    engines.push_back(std::make_unique<TestEngine>(s, stages, vocab));
  std::vector<int32_t> tokens = prompt;
  std::vector<int32_t> generated;
  size_t cached = 0;
  for (int step = 0; step < max_new_tokens; ++step) {
    TensorDict in;
    int32_t count = static_cast<int32_t>(tokens.size() - cached);
    SetBatch(in, {1}, {static_cast<int32_t>(cached)}, {count});
    std::vector<int32_t> fresh(tokens.begin() + cached, tokens.end());
    in.Set(kTokens, Tensor::Of<int32_t>({count}, fresh));
    for (auto& e : engines) in = *e->ExecuteStep(in);
    int32_t next = (*in.Get(kNextTokens, DType::kI32, 1))->values<int32_t>()[0];
    cached = tokens.size();
    tokens.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

}  // namespace connex::pp::testing
