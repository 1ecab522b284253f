#include "connex/engine/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace connex::engine {

bool RopeDependsOnPosition(const ModelConfig& config) {
  return config.rope_scaling.type == RopeScaling::Type::kDynamic;
}

std::vector<float> RopeInverseFrequencies(const ModelConfig& config, int64_t position) {
  const RopeScaling& r = config.rope_scaling;
  const int64_t dim = config.head_dim();
  const double d = static_cast<double>(dim);
  double base = config.rope_theta;
  if (r.type == RopeScaling::Type::kDynamic) {
    // HF's _compute_dynamic_ntk_parameters for seq_len = max(position + 1, max positions).
    const double m = static_cast<double>(config.max_position_embeddings);
    const double seq = std::max(static_cast<double>(position) + 1.0, m);
    base *= std::pow(r.factor * seq / m - (r.factor - 1.0), d / (d - 2.0));
  }
  std::vector<float> out;
  out.reserve(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    double inv = std::pow(base, -2.0 * static_cast<double>(i) / d);
    switch (r.type) {
      case RopeScaling::Type::kNone:
      case RopeScaling::Type::kDynamic:
        break;
      case RopeScaling::Type::kLinear:
        inv /= r.factor;  // positions divided by the factor
        break;
      case RopeScaling::Type::kLlama3: {
        // HF's _compute_llama3_parameters: long wavelengths slowed by the factor, short ones
        // kept, the band between interpolated.
        const double old_len = static_cast<double>(r.original_max_position_embeddings);
        const double low_wavelen = old_len / r.low_freq_factor;
        const double high_wavelen = old_len / r.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / inv;
        if (wavelen > low_wavelen) {
          inv /= r.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth =
              (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          inv = (1.0 - smooth) * inv / r.factor + smooth * inv;
        }
        break;
      }
    }
    out.push_back(static_cast<float>(inv));
  }
  return out;
}

}  // namespace connex::engine
