// connexctl: the operator's tool for a Connex directory — live membership (status), the serving
// deployment (serving: chains, stages, health), the event stream (watch), resolution of a group
// (resolve), and registration from the shell (join, leave, report-failed). Exit codes: 0 ok, 1 a
// request failed, 2 bad usage, 3 a registration was lost.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "connex/base/cli.h"
#include "connex/base/config.h"
#include "connex/base/curve.h"
#include "connex/base/json_text.h"
#include "connex/base/logging.h"
#include "connex/base/signals.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"
#include "connex/directory/secret.h"
#include "connex/serving/deployment.h"
#include "nlohmann/json.hpp"

namespace {

// `serving`: a model listed cannot serve (NOT READY, or no stage 0 answered /health with 200).
constexpr int kNotServingExitCode = 4;

using connex::Annotate;
using connex::Lid;
using connex::directory::DirectoryClient;
using connex::directory::DirectoryClientOptions;
using connex::directory::Event;
using connex::directory::Record;

int Fail(const absl::Status& status) {
  std::cerr << "connexctl: " << status.message() << "\n";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return 2;
    default:
      return 1;
  }
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out;
}

nlohmann::json ToJson(const Record& r) {
  return {{"lid", r.lid.ToString()},
          {"epoch", r.epoch},
          {"addresses", r.addresses},
          {"metadata", r.metadata},
          {"lease_left_ms", r.lease_left_ms}};
}

void PrintTable(const std::vector<Record>& records) {
  size_t lid_width = 3;
  for (const Record& r : records) lid_width = std::max(lid_width, r.lid.ToString().size());
  std::printf("%-*s  %-15s  %-10s  %s\n", static_cast<int>(lid_width), "LID", "EPOCH", "LEASE_MS",
              "ADDRESSES");
  for (const Record& r : records) {
    std::printf("%-*s  %-15llu  %-10lld  %s\n", static_cast<int>(lid_width),
                r.lid.ToString().c_str(), static_cast<unsigned long long>(r.epoch),
                static_cast<long long>(r.lease_left_ms), Join(r.addresses).c_str());
  }
}

std::string FormatEvent(const Event& e) {
  std::string line = connex::StrCat(e.revision, " ", connex::directory::EventKindName(e.kind), " ",
                                    e.record.lid.ToString(), " epoch=", e.record.epoch);
  if (e.kind == connex::directory::EventKind::kMigrated) {
    line += connex::StrCat(" previous_epoch=", e.previous_epoch);
  }
  if (!e.record.addresses.empty()) line += " addresses=" + Join(e.record.addresses);
  if (!e.reason.empty()) line += " reason=" + e.reason;
  return line;
}

// Waits for SIGINT/SIGTERM, or until `stop` becomes true. Returns the signal, or 0.
int WaitForSignal(const connex::TerminationSignals& signals, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    if (int sig = signals.WaitFor(50); sig > 0) return sig;
  }
  return 0;
}

absl::StatusOr<Lid> ParseLid(const std::string& text) { return Lid::Parse(text); }

}  // namespace

int main(int argc, char** argv) {
  connex::cli::App app{"connexctl: inspect and drive a Connex directory"};
  app.require_subcommand(1);
  DirectoryClientOptions options;
  options.directory = "tcp://127.0.0.1:7000";
  app.add_option("--directory", options.directory, "directory request endpoint tcp://HOST:PORT")
      ->envname("CONNEX_DIRECTORY")
      ->capture_default_str();
  // The shared secret: a file, or CONNEX_DIRECTORY_TOKEN; never argv.
  options.token = connex::EnvString("CONNEX_DIRECTORY_TOKEN", "");
  connex::AddRefusedSecretFlag(app, "--token", "--token-file FILE or CONNEX_DIRECTORY_TOKEN");
  std::string token_file;
  app.add_option("--token-file", token_file, "file whose first line is the directory shared secret")
      ->envname("CONNEX_DIRECTORY_TOKEN_FILE");
  // The admin token comes from a file or the environment, never from argv (ps shows argv).
  std::string admin_token_file;
  app.add_option("--admin-token-file", admin_token_file,
                 "file whose first line is the admin token (join --force, leave, report-failed of "
                 "any LID); or set CONNEX_DIRECTORY_ADMIN_TOKEN")
      ->envname("CONNEX_DIRECTORY_ADMIN_TOKEN_FILE");
  app.add_option("--timeout-ms", options.request_timeout_ms, "request timeout")
      ->envname("CONNEX_DIRECTORY_TIMEOUT_MS")
      ->check(connex::cli::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  app.add_option("--heartbeat-ms", options.heartbeat_ms,
                 "heartbeat interval for `join` (0: what the directory advises)")
      ->envname("CONNEX_HEARTBEAT_MS")
      ->check(connex::cli::Range(int64_t{0}, int64_t{3'600'000}));
  connex::AddLogLevelFlag(app, "warn");

  bool json = false;
  connex::cli::App* status =
      app.add_subcommand("status", "table of every record: LID, epoch, lease, addresses");
  status->add_flag("--json", json, "print JSON");
  connex::cli::App* serving = app.add_subcommand(
      "serving", "served models: replica chains, each stage's epoch, stage 0's API and health");
  std::string serving_model;
  serving->add_option("--model", serving_model, "only this model");
  int64_t probe_timeout_ms = 1000;
  serving
      ->add_option("--probe-timeout-ms", probe_timeout_ms,
                   "how long each stage 0's GET /health may take (0: do not probe)")
      ->check(connex::cli::Range(int64_t{0}, int64_t{60'000}))
      ->capture_default_str();
  serving->add_flag("--json", json, "print JSON");
  connex::cli::App* watch =
      app.add_subcommand("watch", "print one line per event until interrupted");
  std::string watch_model;
  watch->add_option("--model", watch_model, "only events of this model");
  connex::cli::App* resolve = app.add_subcommand("resolve", "the live endpoints of MODEL's GROUP");
  std::string model;
  uint32_t group = 0;
  resolve->add_option("model", model, "model name")->required();
  resolve->add_option("group", group, "group index")->required();
  resolve->add_flag("--json", json, "print JSON");
  connex::cli::App* join = app.add_subcommand(
      "join", "register LID and heartbeat until SIGINT/SIGTERM, then leave gracefully");
  std::string lid_text;
  std::vector<std::string> addresses;
  std::vector<std::string> metadata_items;
  join->add_option("lid", lid_text, "model/g<group>/s<shard>/r<replica>")->required();
  join->add_option("--address", addresses, "address to publish (repeatable)")->required();
  join->add_option("--metadata", metadata_items, "KEY=VALUE (repeatable)");
  bool force = false;
  join->add_flag("--force", force,
                 "take LID over from a live holder (needs the admin token; the holder is fenced)");
  connex::cli::App* leave =
      app.add_subcommand("leave", "drain LID: LEFT for every watcher (alias: drain)");
  leave->alias("drain");
  leave->add_option("lid", lid_text, "model/g<group>/s<shard>/r<replica>")->required();
  connex::cli::App* report =
      app.add_subcommand("report-failed", "evict LID for every sender (FAILED)");
  report->add_option("lid", lid_text, "model/g<group>/s<shard>/r<replica>")->required();
  uint64_t epoch = 0;
  report->add_option("--epoch", epoch, "only this epoch (default: the current one)");
  connex::cli::App* keygen = app.add_subcommand(
      "keygen", "write a CURVE key pair: PREFIX.key (secret, mode 600) and PREFIX.pub");
  std::string key_prefix;
  keygen->add_option("--out", key_prefix, "path prefix of the two files")->required();

  // The first word that is neither a global option nor its value names the command.
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("-", 0) == 0) {
      if (word.find('=') == std::string::npos && app.get_option_no_throw(word) != nullptr &&
          app.get_option_no_throw(word)->get_expected_min() > 0) {
        ++i;  // skip the option's value
      }
      continue;
    }
    bool known = false;
    for (const connex::cli::App* sub : app.get_subcommands()) {
      known |= sub->get_name() == word || sub->check_name(word);
    }
    if (!known) {
      std::cerr
          << "connexctl: unknown command '" << word
          << "' (commands: status, serving, watch, resolve, join, leave or drain, report-failed, "
             "keygen)\n";
      return 2;
    }
    break;
  }
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv)) return *code;
  if (keygen->parsed()) {
    absl::StatusOr<connex::CurveKeyPair> keys = connex::GenerateCurveKeyPair();
    if (!keys.ok()) return Fail(keys.status());
    absl::Status written = connex::WriteCurveKeyFiles(key_prefix, *keys);
    if (!written.ok()) return Fail(written);
    std::printf("%s.key  secret key (CONNEX_CURVE_KEY_FILE)\n%s.pub  public key %s\n",
                key_prefix.c_str(), key_prefix.c_str(), keys->public_key.c_str());
    return 0;
  }
  // CURVE comes from the environment only (a secret key file; never argv).
  absl::StatusOr<connex::CurveSettings> curve = connex::CurveSettings::FromEnv();
  if (!curve.ok()) return Fail(curve.status());
  options.curve = *std::move(curve);
  absl::StatusOr<DirectoryClientOptions::Etcd> etcd = DirectoryClientOptions::Etcd::FromEnv();
  if (!etcd.ok()) return Fail(etcd.status());
  options.etcd = *std::move(etcd);
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = connex::directory::ReadSecretFile(token_file);
    if (!token.ok()) return Fail(Annotate(token.status(), "--token-file"));
    options.token = *token;
  }
  if (options.token.empty()) {  // this user's default token, as every client reads it
    absl::StatusOr<std::string> token = connex::directory::ClientTokenFromEnv();
    if (!token.ok()) return Fail(token.status());
    options.token = *token;
  }
  if (!admin_token_file.empty()) {
    absl::StatusOr<std::string> token = connex::directory::ReadSecretFile(admin_token_file);
    if (!token.ok()) return Fail(Annotate(token.status(), "--admin-token-file"));
    options.admin_token = *token;
  } else {
    options.admin_token = connex::EnvString("CONNEX_DIRECTORY_ADMIN_TOKEN", "");
  }

  std::optional<Lid> lid;
  if (!lid_text.empty()) {
    absl::StatusOr<Lid> parsed = ParseLid(lid_text);
    if (!parsed.ok()) return Fail(parsed.status());
    lid = *parsed;
  }
  if (resolve->parsed()) {
    absl::Status ok = Lid::ValidateModel(model);
    if (!ok.ok()) return Fail(ok);
  }
  std::map<std::string, std::string> metadata;
  for (const std::string& item : metadata_items) {
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Fail(absl::InvalidArgumentError("--metadata '" + item + "' is not KEY=VALUE"));
    }
    metadata[item.substr(0, eq)] = item.substr(eq + 1);
  }
  const connex::TerminationSignals signals;

  absl::StatusOr<std::unique_ptr<DirectoryClient>> connected = DirectoryClient::Connect(options);
  if (!connected.ok()) return Fail(connected.status());
  DirectoryClient& client = **connected;

  if (status->parsed()) {
    auto snapshot = client.GetSnapshot();
    if (!snapshot.ok()) return Fail(snapshot.status());
    if (json) {
      nlohmann::json out = {{"revision", snapshot->revision},
                            {"incarnation", snapshot->incarnation},
                            {"records", nlohmann::json::array()}};
      for (const Record& r : snapshot->records) out["records"].push_back(ToJson(r));
      std::printf("%s\n", connex::DumpJson(out).c_str());
    } else {
      PrintTable(snapshot->records);
    }
    return 0;
  }
  if (serving->parsed()) {
    if (!serving_model.empty()) {
      absl::Status ok = Lid::ValidateModel(serving_model);
      if (!ok.ok()) return Fail(Annotate(ok, "--model"));
    }
    auto snapshot =
        serving_model.empty() ? client.GetSnapshot() : client.GetSnapshot(serving_model);
    if (!snapshot.ok()) return Fail(snapshot.status());
    std::vector<connex::serving::ServedModel> models =
        connex::serving::ServedModels(snapshot->records);
    std::map<std::string, connex::serving::HealthProbe> health;
    if (probe_timeout_ms > 0) {
      for (const auto& m : models) {
        for (const auto& [replica, chain] : m.chains) {
          auto zero = chain.find(0);
          if (zero == chain.end()) continue;
          auto http = zero->second.metadata.find("http");
          if (http == zero->second.metadata.end()) continue;
          health[http->second] = connex::serving::ProbeHealth(http->second, probe_timeout_ms);
        }
      }
    }
    if (json) {
      std::printf("%s\n",
                  connex::DumpJson(connex::serving::ServedModelsJson(models, health)).c_str());
    } else {
      std::printf("%s", connex::serving::RenderServedModels(models, health).c_str());
    }
    // Scripts and readiness checks read the exit code: 0 only when every model listed can serve.
    return connex::serving::AllServing(models, health, probe_timeout_ms > 0) ? 0
                                                                             : kNotServingExitCode;
  }
  if (resolve->parsed()) {
    auto snapshot = client.GetSnapshot(model, group);
    if (!snapshot.ok()) return Fail(snapshot.status());
    if (json) {
      nlohmann::json out = nlohmann::json::array();
      for (const Record& r : snapshot->records) out.push_back(ToJson(r));
      std::printf("%s\n", connex::DumpJson(out).c_str());
    } else {
      for (const Record& r : snapshot->records) {
        std::printf("%s epoch=%llu addresses=%s\n", r.lid.ToString().c_str(),
                    static_cast<unsigned long long>(r.epoch), Join(r.addresses).c_str());
      }
    }
    return 0;
  }
  if (watch->parsed()) {
    if (!watch_model.empty()) {
      absl::Status ok = Lid::ValidateModel(watch_model);
      if (!ok.ok()) return Fail(ok);
    }
    client.Subscribe([&watch_model](const Event& e) {
      if (!watch_model.empty() && e.record.lid.model != watch_model) return;
      std::printf("%s\n", FormatEvent(e).c_str());
      std::fflush(stdout);
    });
    absl::Status ok = client.Watch(watch_model);
    if (!ok.ok()) return Fail(ok);
    std::printf("# watching %s at revision %llu\n", options.directory.c_str(),
                static_cast<unsigned long long>(client.view_revision()));
    std::fflush(stdout);
    std::atomic<bool> never{false};
    WaitForSignal(signals, never);
    return 0;
  }
  if (join->parsed()) {
    std::atomic<bool> lost{false};
    std::atomic<int> exit_code{0};
    client.OnRegistrationChange([&](const connex::directory::RegistrationChange& c) {
      if (c.status.ok()) {
        std::printf("rejoined %s epoch=%llu previous_epoch=%llu\n", c.lid.ToString().c_str(),
                    static_cast<unsigned long long>(c.new_epoch),
                    static_cast<unsigned long long>(c.old_epoch));
      } else {
        std::printf("lost %s epoch=%llu: %s\n", c.lid.ToString().c_str(),
                    static_cast<unsigned long long>(c.old_epoch),
                    std::string(c.status.message()).c_str());
        exit_code = 3;
        lost = true;
      }
      std::fflush(stdout);
    });
    auto joined = force ? client.ForceJoin(*lid, addresses, metadata)
                        : client.Join(*lid, addresses, metadata);
    if (!joined.ok()) return Fail(joined.status());
    std::printf("joined %s epoch=%llu\n", lid->ToString().c_str(),
                static_cast<unsigned long long>(*joined));
    std::fflush(stdout);
    int sig = WaitForSignal(signals, lost);
    if (sig != 0) {
      absl::Status left = client.Leave(*lid);
      if (!left.ok()) return Fail(left);
      std::printf("left %s\n", lid->ToString().c_str());
      return 0;
    }
    std::cerr << "connexctl: registration of " << lid->ToString() << " lost\n";
    return exit_code.load();
  }
  if (leave->parsed()) {
    absl::Status left = client.Evict(*lid);
    if (!left.ok()) return Fail(left);
    std::printf("left %s\n", lid->ToString().c_str());
    return 0;
  }
  if (report->parsed()) {
    auto evicted = client.ReportFailed(*lid, epoch, "connexctl");
    if (!evicted.ok()) return Fail(evicted.status());
    std::printf("%s %s\n", *evicted ? "evicted" : "not evicted (that epoch is already gone)",
                lid->ToString().c_str());
    return 0;
  }
  return 2;
}
