// StageEngine's request state as data (the engine contract's ExportState, ImportState and
// DropState): a request's cached K and V rows per layer, and on the last stage its
// repetition-penalty history, for a range of positions. The rows are copied as they are, so an
// engine that imports them holds bit for bit the cache the exporter built, and runs on exactly
// as the exporter would (the K rows carry RoPE of their absolute positions, which an import keeps).
#include <algorithm>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "connex/base/check.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/stage_engine.h"

namespace connex::engine {

std::string StateKey(int64_t layer, char leaf) { return StrCat("kv.", layer, ".", leaf); }

int64_t StageEngine::HeldPositions(uint64_t id) const {
  return std::max<int64_t>(CachedPositions(id), 0);
}

absl::StatusOr<TensorDict> StageEngine::ExportState(uint64_t id, int64_t from, int64_t to) const {
  if (from < 0 || from >= to) {
    return absl::InvalidArgumentError(StrCat("stage ", stage_, ": export of request ", id,
                                             ": positions [", from, ", ", to, ") are empty"));
  }
  const int64_t held = HeldPositions(id);
  if (to > held) {
    return absl::OutOfRangeError(StrCat("stage ", stage_, ": export of request ", id,
                                        ": positions [", from, ", ", to, ") but ", held,
                                        " are held"));
  }
  const RequestCache& c = cache_.find(id)->second;
  CONNEX_CHECK(c.layers.size() == weights_.size());
  const int64_t rows = to - from, kvd = config_.kv_dim();
  TensorDict state;
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const LayerCache& layer = c.layers[l];
    CONNEX_CHECK(static_cast<int64_t>(layer.k.size()) == c.positions * kvd);
    CONNEX_CHECK(static_cast<int64_t>(layer.v.size()) == c.positions * kvd);
    const int64_t li = static_cast<int64_t>(l);
    state.Set(StateKey(li, 'k'),
              Tensor::Of<float>({rows, kvd},
                                std::span<const float>(layer.k).subspan(from * kvd, rows * kvd)));
    state.Set(StateKey(li, 'v'),
              Tensor::Of<float>({rows, kvd},
                                std::span<const float>(layer.v).subspan(from * kvd, rows * kvd)));
  }
  // The history goes along when it covers the range (it does whenever the request is penalized:
  // each of its steps records its tokens).
  std::span<const int32_t> history = history_.Of(id);
  if (static_cast<int64_t>(history.size()) >= to) {
    state.Set(kStateHistory, Tensor::Of<int32_t>({rows}, history.subspan(from, rows)));
  }
  return state;
}

absl::StatusOr<int64_t> StageEngine::CheckState(uint64_t id, int64_t from,
                                                const TensorDict& state) const {
  const std::string what = StrCat("stage ", stage_, ": import of request ", id);
  if (from < 0) {
    return absl::InvalidArgumentError(StrCat(what, ": position ", from, " is negative"));
  }
  const int64_t layers = static_cast<int64_t>(weights_.size()), kvd = config_.kv_dim();
  absl::flat_hash_set<std::string> expected;
  for (int64_t l = 0; l < layers; ++l) {
    expected.insert(StateKey(l, 'k'));
    expected.insert(StateKey(l, 'v'));
  }
  for (const auto& [name, tensor] : state.tensors()) {
    if (!expected.contains(name) && !(name == kStateHistory && is_last())) {
      return absl::InvalidArgumentError(StrCat(
          what, ": unknown key '", name, "' (this stage has ", layers, " layers: kv.0 .. kv.",
          layers - 1, is_last() ? ", and history" : ", and no history", ")"));
    }
  }
  int64_t rows = -1;
  for (int64_t l = 0; l < layers; ++l) {
    for (char leaf : {'k', 'v'}) {
      const std::string key = StateKey(l, leaf);
      if (!state.Contains(key)) {
        return absl::InvalidArgumentError(StrCat(what, ": '", key, "' is missing"));
      }
      absl::StatusOr<const Tensor*> t = state.Get(key, DType::kF32, 2);
      if (!t.ok()) return Annotate(t.status(), what);
      const std::vector<int64_t>& shape = (*t)->shape;
      if (shape[1] != kvd || (rows >= 0 && shape[0] != rows) || shape[0] < 1) {
        return absl::InvalidArgumentError(
            StrCat(what, ": '", key, "' has shape ", ShapeString(shape), ", expected [",
                   rows >= 0 ? StrCat(rows) : std::string("rows >= 1"), ", ", kvd, "] (kv_dim)"));
      }
      rows = shape[0];
    }
  }
  if (from + rows > config_.max_positions()) {
    return absl::InvalidArgumentError(StrCat(what, ": positions [", from, ", ", from + rows,
                                             ") pass the model's ", config_.max_positions()));
  }
  if (state.Contains(kStateHistory)) {
    absl::StatusOr<const Tensor*> t = state.Get(kStateHistory, DType::kI32, 1);
    if (!t.ok()) return Annotate(t.status(), what);
    if ((*t)->shape[0] != rows) {
      return absl::InvalidArgumentError(StrCat(what, ": '", kStateHistory, "' has shape ",
                                               ShapeString((*t)->shape), ", expected [", rows,
                                               "] (the rows of the K and V tensors)"));
    }
  }
  if (from > 0) {
    const int64_t held = HeldPositions(id);
    if (held != from) {
      return absl::FailedPreconditionError(StrCat(what, ": the state starts at position ", from,
                                                  " but ", held, " positions are held"));
    }
    if (state.Contains(kStateHistory) && history_.Size(id) != from) {
      return absl::FailedPreconditionError(StrCat(what, ": the state's history starts at position ",
                                                  from, " but ", history_.Size(id),
                                                  " tokens of its history are held"));
    }
  }
  return rows;
}

absl::Status StageEngine::ImportState(uint64_t id, int64_t from, const TensorDict& state) {
  CONNEX_ASSIGN_OR_RETURN(const int64_t rows, CheckState(id, from, state));
  // From here on the import cannot fail.
  RequestCache& c = cache_[id];
  if (from == 0) {
    c = RequestCache();
    c.layers.resize(weights_.size());
    history_.Release(id);
  }
  CONNEX_CHECK(c.positions == from && c.layers.size() == weights_.size());
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const int64_t li = static_cast<int64_t>(l);
    std::span<const float> k = state.Find(StateKey(li, 'k'))->values<float>();
    std::span<const float> v = state.Find(StateKey(li, 'v'))->values<float>();
    c.layers[l].k.insert(c.layers[l].k.end(), k.begin(), k.end());
    c.layers[l].v.insert(c.layers[l].v.end(), v.begin(), v.end());
  }
  c.positions += rows;
  if (const Tensor* history = state.Find(kStateHistory); history != nullptr) {
    history_.Append(id, from, history->values<int32_t>());
  }
  return absl::OkStatus();
}

absl::Status StageEngine::DropState(uint64_t id, int64_t from) {
  if (from < 0) {
    return absl::InvalidArgumentError(
        StrCat("stage ", stage_, ": cannot cut request ", id, " back to position ", from));
  }
  if (from == 0) {
    Release(id);
    return absl::OkStatus();
  }
  auto it = cache_.find(id);
  if (it != cache_.end() && it->second.positions > from) {
    RequestCache& c = it->second;
    const size_t size = static_cast<size_t>(from * config_.kv_dim());
    for (LayerCache& l : c.layers) {
      l.k.resize(size);
      l.v.resize(size);
    }
    c.positions = from;
  }
  history_.CutBack(id, from);
  return absl::OkStatus();
}

}  // namespace connex::engine
