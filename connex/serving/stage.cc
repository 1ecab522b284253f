#include "connex/serving/stage.h"

#include <algorithm>
#include <filesystem>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/thread_pool.h"
#include "connex/pp/signal_transport.h"
#include "connex/transport/transfer_engine.h"

namespace connex::serving {

absl::Status StageProcessOptions::Validate() const {
  if (model_path.empty()) return absl::InvalidArgumentError("--model (CONNEX_MODEL) is required");
  if (stages < 1) return absl::InvalidArgumentError("--stages must be at least 1");
  if (stage >= stages) {
    return absl::InvalidArgumentError(StrCat("--stage ", stage, " is outside a pipeline of ",
                                             stages, " stages (0 .. ", stages - 1, ")"));
  }
  if (!model_name.empty()) {
    absl::Status name = Lid::ValidateModel(model_name);
    if (!name.ok()) return Annotate(name, "--model-name");
  }
  if (threads < 0) return absl::InvalidArgumentError(StrCat("--threads ", threads, " is negative"));
  if (pd_role != pp::PdRole::kNone) {
    const uint32_t want = pd_role == pp::PdRole::kFrontend ? 0 : 1;
    if (stages != 2 || stage != want) {
      return absl::InvalidArgumentError(StrCat(
          "--pd-role ", pp::PdRoleName(pd_role), ": a prefill-decode ", pp::PdRoleName(pd_role),
          " is --stage ", want, " of --stages 2 (not --stage ", stage, " of ", stages, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StageProcess>> StageProcess::Start(
    StageProcessOptions options, pp::StageNodeOptions node_defaults) {
  if (options.model_name.empty()) options.model_name = ServedModelName(options.model_path);
  CONNEX_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<StageProcess> p(new StageProcess());
  p->options_ = options;
  const Lid lid{options.model_name, pp::PdGroup(options.pd_role, options.stage), 0,
                options.replica};

  // The slice first: a bad checkpoint is the most likely mistake, and costs nothing to report.
  engine::StageOptions so;
  so.stage = static_cast<int>(options.stage);
  so.stages = static_cast<int>(options.stages);
  if (options.pd_role != pp::PdRole::kNone) {
    // A frontend embeds the prompt; an instance runs every layer and the head.
    absl::StatusOr<engine::ModelConfig> config = engine::ReadModelConfig(options.model_path);
    if (!config.ok()) return Annotate(config.status(), StrCat("--model ", options.model_path));
    so.layers = options.pd_role == pp::PdRole::kFrontend
                    ? engine::LayerRange{0, 0}
                    : engine::LayerRange{0, config->num_hidden_layers};
  }
  if (options.threads > 0) so.pool = std::make_shared<engine::ThreadPool>(options.threads);
  absl::StatusOr<std::unique_ptr<engine::StageEngine>> loaded =
      engine::StageEngine::Load(options.model_path, so);
  if (!loaded.ok()) return Annotate(loaded.status(), StrCat("--model ", options.model_path));
  p->engine_ = *std::move(loaded);

  CONNEX_ASSIGN_OR_RETURN(directory::DirectoryClientOptions dopts,
                          directory::DirectoryClientOptions::FromEnv());
  dopts.directory = options.directory;
  CONNEX_ASSIGN_OR_RETURN(p->directory_, directory::DirectoryClient::Connect(dopts));

  CONNEX_ASSIGN_OR_RETURN(transport::TransportOptions topts,
                          transport::TransportOptions::FromEnv(lid));
  CONNEX_ASSIGN_OR_RETURN(topts.backend, transport::ParseBackend(options.backend));
  CONNEX_ASSIGN_OR_RETURN(transport::TransferEnginePtr transfer,
                          transport::CreateTransferEngine(topts));
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<pp::SignalTransport> signals,
                          pp::CreateZmqSignalTransport(options.signal_host, dopts.curve));

  // Every stage says how many there are: connexctl's serving view and tools find a served
  // model's chains by it.
  node_defaults.metadata["stages"] = StrCat(options.stages);
  node_defaults.model = options.model_name;
  node_defaults.stage = options.stage;
  node_defaults.stages = options.stages;
  node_defaults.replica = options.replica;
  node_defaults.eos_token = static_cast<int32_t>(p->engine_->config().eos_token_id());
  CONNEX_ASSIGN_OR_RETURN(pp::StageNodeOptions nopts, pp::StageNodeOptions::FromEnv(node_defaults));
  if (options.kv_standby) nopts.kv_standby = *options.kv_standby;
  nopts.pd_role = options.pd_role;
  p->stall_unhealthy_ms_ = std::max<int64_t>(15'000, 3 * nopts.step_timeout_ms);
  CONNEX_ASSIGN_OR_RETURN(p->node_, pp::StageNode::Start(nopts, *p->engine_, std::move(transfer),
                                                         std::move(signals), *p->directory_));
  return p;
}

StageProcess::~StageProcess() { Stop(/*leave=*/false); }

void StageProcess::Stop(bool leave, int64_t drain_timeout_ms) {
  if (node_) node_->Stop(leave, drain_timeout_ms);
}

absl::Status StageProcess::ChainReady() const {
  std::vector<directory::Record> view = directory_->View(options_.model_name);
  std::string missing;
  const bool pd = options_.pd_role != pp::PdRole::kNone;
  for (uint32_t g = 0; g < (pd ? pp::kPdGroups : options_.stages); ++g) {
    bool live = false;
    for (const directory::Record& r : view) live |= r.lid.group == g && r.lid.shard == 0;
    if (!live) {
      missing += StrCat(missing.empty() ? "" : ", ", g);
      if (pd) missing += StrCat(" (", pp::PdGroupName(g), ")");
    }
  }
  if (missing.empty()) {
    CONNEX_RETURN_IF_ERROR(node_->health());
    const pp::StageNodeStats stats = node_->stats();
    if (stats.stalled_ms > stall_unhealthy_ms_) {
      return absl::UnavailableError(
          StrCat("model ", options_.model_name, ": no step of the ", stats.requests_in_flight,
                 " requests in flight came back for ", stats.stalled_ms, " ms"));
    }
    return absl::OkStatus();
  }
  return absl::UnavailableError(StrCat("model ", options_.model_name, ": no live replica of ",
                                       pd ? "group " : "stage ", missing));
}

}  // namespace connex::serving
