// The resume proxy's forwarding of a request that is answered whole and holds no generation
// (POST /tokenize, /detokenize): sent as it came to one stage-0 replica after another until one
// answers, the answer passed back as it is. Nothing is resumed: such a request is cheap to repeat.
// Thread-safe (one blocking HTTP exchange per call, on the calling thread).
#ifndef CONNEX_SERVING_INTERNAL_FORWARD_H_
#define CONNEX_SERVING_INTERNAL_FORWARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/serving/proxy.h"

namespace connex::serving::internal {

struct ForwardedAnswer {
  int status = 0;
  std::string content_type;
  std::string body;
};

// POSTs `body` to `target` at each of `replicas` in turn until one answers (any HTTP status).
// Unavailable naming the replicas and their failures when none does (or there are none).
absl::StatusOr<ForwardedAnswer> ForwardToReplicas(const std::vector<Replica>& replicas,
                                                  const std::string& target,
                                                  const std::string& body, int64_t timeout_ms);

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_FORWARD_H_
