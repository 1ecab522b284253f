// Batch helpers of the step protocol: selecting some requests of a step's tensor dict, and
// rewriting its request ids. Pure functions; thread-compatible.
#ifndef CONNEX_PP_INTERNAL_BATCH_SELECT_H_
#define CONNEX_PP_INTERNAL_BATCH_SELECT_H_

#include <cstdint>
#include <vector>

#include "connex/pp/engine.h"
#include "connex/pp/tensor_dict.h"

namespace connex::pp::internal {

// Replaces the request ids of a step's batch key with `ids` (positionally, in the batch's
// order), so that an engine sees a stage's local ids and the next stage the owner's.
void RewriteIds(TensorDict& dict, const std::vector<uint64_t>& ids);

// Keeps the requests of `in` (whose batch is `batch`) for which keep[i] is true. Tensors whose
// first dimension is the token count N are sliced by token ranges, those whose first dimension
// is B by request; others are kept whole.
TensorDict Select(const TensorDict& in, const Batch& batch, const std::vector<bool>& keep);

}  // namespace connex::pp::internal

#endif  // CONNEX_PP_INTERNAL_BATCH_SELECT_H_
