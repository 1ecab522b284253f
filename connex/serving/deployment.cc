#include "connex/serving/deployment.h"

#include <algorithm>

#include "connex/base/json_text.h"
#include "connex/base/strings.h"
#include "connex/serving/http_client.h"
#include "connex/serving/http_server.h"
#include "connex/serving/listen_address.h"

namespace connex::serving {
namespace {

std::optional<uint32_t> DeclaredStages(const directory::Record& r) {
  auto it = r.metadata.find("stages");
  if (it == r.metadata.end()) return std::nullopt;
  try {
    size_t used = 0;
    unsigned long n = std::stoul(it->second, &used);
    if (used != it->second.size() || n == 0 || n > 1024) return std::nullopt;
    return static_cast<uint32_t>(n);
  } catch (...) {
    return std::nullopt;
  }
}

std::string HealthText(const std::map<std::string, HealthProbe>& health, const std::string& api) {
  auto it = health.find(api);
  if (it == health.end()) return "-";
  if (it->second.status == 200) return "ok";
  if (it->second.status == 0) return "unreachable (" + it->second.detail + ")";
  return StrCat(it->second.status, it->second.detail.empty() ? "" : " " + it->second.detail);
}

}  // namespace

std::vector<ServedModel> ServedModels(const std::vector<directory::Record>& records) {
  std::map<std::string, ServedModel> by_name;
  for (const directory::Record& r : records) {
    std::optional<uint32_t> stages = DeclaredStages(r);
    if (!stages || r.lid.shard != 0) continue;
    ServedModel& m = by_name[r.lid.model];
    m.model = r.lid.model;
    m.stages = std::max(m.stages, *stages);
    m.chains[r.lid.replica][r.lid.group] = r;
  }
  std::vector<ServedModel> out;
  for (auto& [name, m] : by_name) {
    for (uint32_t s = 0; s < m.stages; ++s) {
      bool live = false;
      for (const auto& [replica, chain] : m.chains) live |= chain.count(s) > 0;
      if (!live) m.missing_stages.push_back(s);
    }
    out.push_back(std::move(m));
  }
  return out;
}

HealthProbe ProbeHealth(const std::string& http_address, int64_t timeout_ms) {
  HttpServerOptions parsed;
  if (absl::Status ok = ParseListenAddress("http", http_address, &parsed); !ok.ok()) {
    return {0, "not HOST:PORT"};
  }
  absl::StatusOr<HttpReply> reply = HttpGet(parsed.host, parsed.port, "/health", timeout_ms);
  if (!reply.ok()) {
    if (reply.status().code() == absl::StatusCode::kInvalidArgument) {
      return {0, "not a numeric address"};
    }
    return {0, std::string(reply.status().message())};
  }
  HealthProbe probe{reply->status, ""};
  nlohmann::json body = ParseJson(reply->body);
  if (body.is_object() && body.contains("reason") && body["reason"].is_string()) {
    probe.detail = body["reason"].get<std::string>();
  }
  return probe;
}

bool AllServing(const std::vector<ServedModel>& models,
                const std::map<std::string, HealthProbe>& health, bool probed) {
  if (models.empty()) return false;
  for (const ServedModel& m : models) {
    if (!m.ready()) return false;
    if (!probed) continue;
    bool healthy = false;
    for (const auto& [replica, chain] : m.chains) {
      auto zero = chain.find(0);
      if (zero == chain.end()) continue;
      auto http = zero->second.metadata.find("http");
      if (http == zero->second.metadata.end()) continue;
      auto probe = health.find(http->second);
      healthy = healthy || (probe != health.end() && probe->second.status == 200);
    }
    if (!healthy) return false;
  }
  return true;
}

std::string RenderServedModels(const std::vector<ServedModel>& models,
                               const std::map<std::string, HealthProbe>& health) {
  if (models.empty()) return "no served model (no record declares \"stages\")\n";
  std::string out;
  for (const ServedModel& m : models) {
    out += StrCat("model ", m.model, ": ", m.stages, " stages, ", m.chains.size(), " replica",
                  m.chains.size() == 1 ? "" : "s", ", ");
    if (m.ready()) {
      out += "ready (every stage has a live replica)\n";
    } else {
      std::string missing;
      for (uint32_t s : m.missing_stages) missing += StrCat(missing.empty() ? "" : ",", s);
      out += StrCat("NOT READY: no live replica of stage ", missing, "\n");
    }
    // Cells as wide as the widest of their column.
    auto cell_text = [](const std::map<uint32_t, directory::Record>& chain, uint32_t s) {
      auto it = chain.find(s);
      return it == chain.end() ? std::string("missing") : StrCat("epoch ", it->second.epoch);
    };
    auto api_of = [](const std::map<uint32_t, directory::Record>& chain) {
      auto zero = chain.find(0);
      if (zero == chain.end()) return std::string("-");
      auto h = zero->second.metadata.find("http");
      return h == zero->second.metadata.end() ? std::string("-") : h->second;
    };
    size_t width = 8, api_width = 3;
    for (uint32_t s = 0; s < m.stages; ++s) width = std::max(width, StrCat("STAGE ", s).size());
    for (const auto& [replica, chain] : m.chains) {
      for (uint32_t s = 0; s < m.stages; ++s) width = std::max(width, cell_text(chain, s).size());
      api_width = std::max(api_width, api_of(chain).size());
    }
    auto pad = [](std::string text, size_t w) {
      text.resize(std::max(text.size(), w), ' ');
      return text;
    };
    out += "  REPLICA";
    for (uint32_t s = 0; s < m.stages; ++s) out += "  " + pad(StrCat("STAGE ", s), width);
    out += "  " + pad("API", api_width) + "  HEALTH\n";
    for (const auto& [replica, chain] : m.chains) {
      out += "  " + pad(StrCat("r", replica), 7);
      for (uint32_t s = 0; s < m.stages; ++s) out += "  " + pad(cell_text(chain, s), width);
      const std::string api = api_of(chain);
      out += "  " + pad(api, api_width) + "  ";
      out += (api == "-" ? "-" : HealthText(health, api)) + "\n";
    }
  }
  return out;
}

nlohmann::json ServedModelsJson(const std::vector<ServedModel>& models,
                                const std::map<std::string, HealthProbe>& health) {
  nlohmann::json out = nlohmann::json::array();
  for (const ServedModel& m : models) {
    nlohmann::json replicas = nlohmann::json::array();
    for (const auto& [replica, chain] : m.chains) {
      nlohmann::json stages = nlohmann::json::array();
      for (uint32_t s = 0; s < m.stages; ++s) {
        auto it = chain.find(s);
        if (it == chain.end()) {
          stages.push_back(nullptr);
          continue;
        }
        stages.push_back({{"stage", s},
                          {"lid", it->second.lid.ToString()},
                          {"epoch", it->second.epoch},
                          {"lease_left_ms", it->second.lease_left_ms}});
      }
      nlohmann::json r = {
          {"replica", replica}, {"stages", stages}, {"http", nullptr}, {"health", nullptr}};
      if (auto zero = chain.find(0); zero != chain.end()) {
        if (auto h = zero->second.metadata.find("http"); h != zero->second.metadata.end()) {
          r["http"] = h->second;
          if (auto p = health.find(h->second); p != health.end()) {
            r["health"] = {{"status", p->second.status}, {"detail", p->second.detail}};
          }
        }
      }
      replicas.push_back(std::move(r));
    }
    out.push_back({{"model", m.model},
                   {"stages", m.stages},
                   {"ready", m.ready()},
                   {"missing_stages", m.missing_stages},
                   {"replicas", std::move(replicas)}});
  }
  return out;
}

}  // namespace connex::serving
