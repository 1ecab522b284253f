// The step protocol's state of one stage as Prometheus text, and the small HTTP server that
// shows it for a stage without the API (`connex-stage --metrics HOST:PORT`): every field of
// pp::StageNodeStats as `connex_stage_<field>` — counters with `_total`, the rest gauges — so an
// operator (and the e2e test) sees on every stage, not only on stage 0, how many requests it
// still holds, how many steps it ran, replayed, fenced, released. Thread-safe.
#ifndef CONNEX_SERVING_NODE_METRICS_H_
#define CONNEX_SERVING_NODE_METRICS_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "connex/pp/node.h"
#include "connex/serving/http_server.h"
#include "connex/serving/router.h"
#include "connex/serving/stage.h"

namespace connex::serving {

// `stats` in the text exposition format (one family per field).
std::string RenderNodeStats(const pp::StageNodeStats& stats);

// GET /metrics (RenderNodeStats) and GET /health (200 once attached to a stage whose node is
// healthy, 503 with the reason otherwise) of one stage.
class StageMetricsServer {
 public:
  // Binds `options`' address and answers at once (503 until Attach): the address goes into the
  // stage's record (metadata "metrics"), so it must be known before the stage joins.
  static absl::StatusOr<std::unique_ptr<StageMetricsServer>> Listen(HttpServerOptions options);
  void Attach(StageProcess& stage) { stage_.store(&stage); }
  ~StageMetricsServer();  // Stop()

  std::string address() const { return http_->address(); }
  // Stop it before the stage it shows.
  void Stop();

 private:
  StageMetricsServer() = default;
  std::atomic<StageProcess*> stage_{nullptr};
  Router router_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace connex::serving

#endif  // CONNEX_SERVING_NODE_METRICS_H_
