// Deployment: the serving view of a directory snapshot, as `connexctl serving` prints it — for
// each served model (records whose metadata carries "stages", as every connex-stage publishes),
// its replica chains, the LID and epoch of each stage, stage 0's API address, and whether the
// model can serve (every stage has a live replica: chains are cross-linked by the step protocol,
// so one live replica per stage is enough). ProbeHealth asks a stage 0's `GET /health`.
// Thread-safe (pure functions; ProbeHealth blocks for at most its timeout).
#ifndef CONNEX_SERVING_DEPLOYMENT_H_
#define CONNEX_SERVING_DEPLOYMENT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "connex/directory/protocol.h"
#include "nlohmann/json.hpp"

namespace connex::serving {

struct ServedModel {
  std::string model;
  uint32_t stages = 0;  // the largest "stages" its records declare
  // replica -> stage -> record (shard 0).
  std::map<uint32_t, std::map<uint32_t, directory::Record>> chains;
  // Stages with no live replica at all (the model cannot serve while any is missing).
  std::vector<uint32_t> missing_stages;
  bool ready() const { return missing_stages.empty(); }
};

// The served models of `records`, by name.
std::vector<ServedModel> ServedModels(const std::vector<directory::Record>& records);

// What a stage 0's /health said: the HTTP status (200 ready, 503 not), or why it did not answer.
struct HealthProbe {
  int status = 0;      // 0: no answer
  std::string detail;  // the body's reason, or the connection error
};
HealthProbe ProbeHealth(const std::string& http_address, int64_t timeout_ms);

// Whether every model of `models` can serve: there is at least one, each is ready() and, when
// `probed`, some stage 0 of each answered its /health probe with 200.
bool AllServing(const std::vector<ServedModel>& models,
                const std::map<std::string, HealthProbe>& health, bool probed);

// The table `connexctl serving` prints; `health` holds the probes by stage-0 API address (an
// address without a probe shows "-").
std::string RenderServedModels(const std::vector<ServedModel>& models,
                               const std::map<std::string, HealthProbe>& health);
// The same as JSON: [{"model", "stages", "ready", "missing_stages", "replicas": [{"replica",
// "http", "health", "stages": [{"stage", "lid", "epoch", "lease_left_ms"} or null]}]}].
nlohmann::json ServedModelsJson(const std::vector<ServedModel>& models,
                                const std::map<std::string, HealthProbe>& health);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_DEPLOYMENT_H_
