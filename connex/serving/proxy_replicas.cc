// Where the resume proxy's replicas come from: the directory's live view of the model (proxy.h's
// StageZeroReplicas, ChainProblem, WatchReplicas).
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/deployment.h"
#include "connex/serving/proxy.h"

namespace connex::serving {

std::vector<Replica> StageZeroReplicas(const std::vector<directory::Record>& view,
                                       std::string_view model) {
  std::vector<Replica> out;
  for (const directory::Record& r : view) {
    if (r.lid.model != model || r.lid.group != 0) continue;
    auto http_address = r.metadata.find("http");
    if (http_address == r.metadata.end() || http_address->second.empty()) continue;
    out.push_back(Replica{StrCat(r.lid.ToString(), "@", r.epoch), http_address->second});
  }
  return out;
}

std::string ChainProblem(const std::vector<directory::Record>& view, std::string_view model) {
  for (const ServedModel& m : ServedModels(view)) {
    if (m.model != model || m.ready()) continue;
    std::string stages;
    for (uint32_t s : m.missing_stages) stages += StrCat(stages.empty() ? "" : ", ", s);
    return StrCat("no live replica of stage ", stages, " (of ", m.stages, ")");
  }
  return "";
}

absl::StatusOr<uint64_t> WatchReplicas(directory::DirectoryClient& directory,
                                       const std::string& model, ResumeProxy& proxy) {
  CONNEX_RETURN_IF_ERROR(directory.Watch(model));
  auto update = [&directory, &proxy, model] {
    std::vector<directory::Record> view = directory.View(model);
    proxy.SetReplicas(StageZeroReplicas(view, model));
    proxy.SetChainProblem(ChainProblem(view, model));
  };
  const uint64_t id = directory.Subscribe([update](const directory::Event&) { update(); });
  update();
  return id;
}

}  // namespace connex::serving
