#include "connex/engine/sampler.h"

#include <algorithm>
#include <bit>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "connex/base/check.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/kernels.h"

namespace connex::engine {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;  // the golden ratio
constexpr uint32_t kW1 = 0xBB67AE85u;  // sqrt(3) - 1
// The stream of token draws (counter word 2), so that other uses of a seed can take others.
constexpr uint32_t kTokenStream = 0x746f6b65u;  // "toke"

// A logit's bits as an unsigned key that orders the larger logit first (-0 as +0: equal logits
// tie, and the id decides).
uint32_t DescendingKey(float logit) {
  const uint32_t bits = std::bit_cast<uint32_t>(logit == 0 ? 0.0f : logit);
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

}  // namespace

void SortCandidateKeys(std::vector<uint64_t>& keys) {
  // Least significant digit first, 11 bits a pass over the upper 32: each pass a stable
  // counting sort, so after the last the keys are ordered by their upper halves and, within
  // equal ones, as they came.
  constexpr int kDigitBits = 11;
  constexpr uint64_t kDigits = uint64_t{1} << kDigitBits;
  std::vector<uint64_t> sorted(keys.size());
  std::vector<size_t> start(kDigits);
  for (int shift = 32; shift < 64; shift += kDigitBits) {
    std::fill(start.begin(), start.end(), 0);
    for (uint64_t k : keys) ++start[(k >> shift) & (kDigits - 1)];
    size_t at = 0;
    for (size_t& s : start) at += std::exchange(s, at);
    for (uint64_t k : keys) sorted[start[(k >> shift) & (kDigits - 1)]++] = k;
    keys.swap(sorted);
  }
}

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

double UniformAt(uint64_t seed, uint64_t position) {
  std::array<uint32_t, 4> r = Philox4x32(
      {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), kTokenStream, 0},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 32) | r[1];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

void ApplyRepetitionPenalty(std::span<float> logits, float penalty,
                            std::span<const int32_t> history) {
  std::vector<bool> seen(logits.size());
  for (int32_t id : history) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size() || seen[id]) continue;
    seen[id] = true;
    float& l = logits[id];
    l = l > 0 ? l / penalty : l * penalty;
  }
}

int32_t SampleToken(std::span<const float> raw, const pp::Sampling& sampling, uint64_t position,
                    std::span<const int32_t> history) {
  CONNEX_CHECK(!raw.empty());
  std::vector<float> penalized;
  std::span<const float> logits = raw;
  if (sampling.penalized()) {
    penalized.assign(raw.begin(), raw.end());
    ApplyRepetitionPenalty(penalized, sampling.repetition_penalty, history);
    logits = penalized;
  }
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (sampling.greedy()) return static_cast<int32_t>(ArgMax(logits.data(), vocab));
  // Candidates, most probable first; ties by the lower id: a total order, so the same logits
  // always give the same list. Sorted as one 64-bit key per candidate (the logit's bits made to
  // order as unsigned, most probable first, above its id), not by an indirect comparison: the
  // same order, several times faster on a vocabulary of 128K (the order and the sums below are
  // the sampler's definition; SampleTokenTest compares with it written plainly).
  std::vector<uint64_t> order(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab; ++id) {
    order[static_cast<size_t>(id)] =
        (uint64_t{DescendingKey(logits[id])} << 32) | static_cast<uint32_t>(id);
  }
  size_t keep = order.size();
  if (sampling.top_k > 0 && static_cast<size_t>(sampling.top_k) < keep) {
    keep = static_cast<size_t>(sampling.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep), order.end());
  } else {
    SortCandidateKeys(order);  // the ids ascend along `order`: as std::sort, about 5x faster
  }
  auto id_at = [&order](size_t i) { return static_cast<int32_t>(order[i] & 0xFFFFFFFFu); };
  // Unnormalised probabilities in double, in that order.
  const double max_logit = logits[id_at(0)];
  const double temperature = sampling.temperature;
  std::vector<double> mass(keep);
#if defined(__AVX__)
  // The vector code above (and the kernels before it) leave the upper halves of the vector
  // registers dirty, and g++ 12 puts no vzeroupper before the calls to exp: glibc's exp entry
  // point starts with legacy-SSE instructions, which then pay the SSE/AVX transition on every
  // call (150 ns instead of 5 per exp, measured with perf: a 128K vocabulary's masses took 20 ms
  // a token). Cleared once here; nothing computed changes.
  _mm256_zeroupper();
#endif
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    mass[i] = std::exp((static_cast<double>(logits[id_at(i)]) - max_logit) / temperature);
    // min_p: a token's probability over the most probable one's is mass[i] / mass[0] = mass[i];
    // masses fall along the order, so the survivors are a prefix (vLLM applies min_p before
    // top_k and top_p: top_p's mass is of the survivors).
    if (mass[i] < sampling.min_p) {
      keep = i;
      break;
    }
    total += mass[i];
  }
  // Nucleus: the shortest prefix whose mass reaches top_p of the whole.
  if (sampling.top_p < 1) {
    const double target = static_cast<double>(sampling.top_p) * total;
    double sum = 0;
    size_t cut = 0;
    while (cut < keep) {
      sum += mass[cut++];
      if (sum >= target) break;
    }
    keep = cut;
    total = sum;
  }
  const double u = UniformAt(sampling.seed, position) * total;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    sum += mass[i];
    if (u < sum) return id_at(i);
  }
  return id_at(keep - 1);  // u rounded up to the total
}

absl::Status TokenHistory::Check(const pp::TensorDict& in, std::span<const uint64_t> ids,
                                 std::span<const int64_t> starts, std::span<const int64_t> counts,
                                 std::span<const pp::Sampling> sampling) const {
  int64_t tokens = 0;
  bool penalized = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    tokens += counts[i];
    penalized |= sampling[i].penalized();
  }
  if (!penalized) return absl::OkStatus();
  CONNEX_ASSIGN_OR_RETURN(const pp::Tensor* history, pp::GetSamplingHistory(in, tokens));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!sampling[i].penalized()) continue;
    if (history == nullptr) {
      return absl::InvalidArgumentError(StrCat("request ", ids[i], " has repetition_penalty ",
                                               sampling[i].repetition_penalty,
                                               " but the step carries no ", pp::kSamplingHistory));
    }
    const size_t held = Of(ids[i]).size();
    if (starts[i] > 0 && held < static_cast<size_t>(starts[i])) {
      return absl::InvalidArgumentError(
          StrCat("request ", ids[i], ": the step starts at ", starts[i], " but ", held,
                 " tokens of its history are held (for repetition_penalty)"));
    }
  }
  return absl::OkStatus();
}

void TokenHistory::Record(const pp::TensorDict& in, std::span<const uint64_t> ids,
                          std::span<const int64_t> starts, std::span<const int64_t> counts,
                          std::span<const pp::Sampling> sampling) {
  const pp::Tensor* history = in.Find(pp::kSamplingHistory);
  if (history == nullptr) return;
  std::span<const int32_t> step = history->values<int32_t>();
  size_t first = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t count = static_cast<size_t>(counts[i]);
    if (sampling[i].penalized()) {
      std::vector<int32_t>& tokens = tokens_[ids[i]];
      tokens.resize(static_cast<size_t>(starts[i]));  // Check: at most what is held
      tokens.insert(tokens.end(), step.begin() + first, step.begin() + first + count);
    }
    first += count;
  }
}

std::span<const int32_t> TokenHistory::Of(uint64_t id) const {
  auto it = tokens_.find(id);
  if (it == tokens_.end()) return {};
  return it->second;
}

void TokenHistory::Append(uint64_t id, int64_t from, std::span<const int32_t> rows) {
  CONNEX_CHECK(!rows.empty());
  std::vector<int32_t>& tokens = tokens_[id];
  if (from == 0) tokens.clear();
  CONNEX_CHECK(static_cast<int64_t>(tokens.size()) == from);  // the importer checked
  tokens.insert(tokens.end(), rows.begin(), rows.end());
}

void TokenHistory::CutBack(uint64_t id, int64_t size) {
  CONNEX_CHECK(size >= 0);
  auto it = tokens_.find(id);
  if (it == tokens_.end() || static_cast<int64_t>(it->second.size()) <= size) return;
  if (size == 0) {
    tokens_.erase(it);
    return;
  }
  it->second.resize(static_cast<size_t>(size));
}

}  // namespace connex::engine
