#include "connex/pp/internal/batch_select.h"

namespace connex::pp::internal {

void RewriteIds(TensorDict& dict, const std::vector<uint64_t>& ids) {
  std::vector<int64_t> v(ids.begin(), ids.end());
  dict.Set(kRequestIds, Tensor::Of<int64_t>({static_cast<int64_t>(v.size())}, v));
}

TensorDict Select(const TensorDict& in, const Batch& batch, const std::vector<bool>& keep) {
  const int64_t b = static_cast<int64_t>(batch.request_ids.size());
  int64_t n = 0;
  for (int32_t c : batch.num_tokens) n += c;
  std::vector<uint64_t> ids;
  std::vector<int32_t> starts, counts;
  for (int64_t i = 0; i < b; ++i) {
    if (!keep[i]) continue;
    ids.push_back(batch.request_ids[i]);
    starts.push_back(batch.start_positions[i]);
    counts.push_back(batch.num_tokens[i]);
  }
  TensorDict out;
  SetBatch(out, ids, starts, counts);
  for (const auto& [name, t] : in.tensors()) {
    if (name == kRequestIds || name == kStartPositions || name == kNumTokens) continue;
    if (t.shape.empty() || (t.shape[0] != n && t.shape[0] != b)) {
      out.Set(name, t);
      continue;
    }
    const bool by_token = t.shape[0] == n;
    const size_t row = t.shape[0] == 0 ? 0 : t.data.size() / static_cast<size_t>(t.shape[0]);
    Tensor s;
    s.dtype = t.dtype;
    s.shape = t.shape;
    int64_t rows = 0;
    int64_t offset = 0;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t len = by_token ? batch.num_tokens[i] : 1;
      if (keep[i]) {
        s.data.insert(s.data.end(), t.data.begin() + offset * row,
                      t.data.begin() + (offset + len) * row);
        rows += len;
      }
      offset += len;
    }
    s.shape[0] = rows;
    out.Set(name, std::move(s));
  }
  return out;
}

}  // namespace connex::pp::internal
