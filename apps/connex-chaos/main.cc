// connex-chaos: the campaigns that back Connex's claims, on a deployment it starts itself on free
// loopback ports (a directory, replica chains of connex-stage, connex-proxy) — failover under
// kill / stop / partition of a stage, churn of whole replicas, steady-state latency and
// throughput per K, overload, the proxy's cost, and `make demo`. Every completed request's token
// ids are compared with connex-generate's. Progress on stderr, a summary on stdout, the whole
// record with --json. Exit 0 when every check held, 1 when one did not (or the campaign could not
// run), 2 for bad usage, 130 on SIGINT/SIGTERM (everything it started is stopped and removed in
// every case). Flags: docs/configuration.md ("connex-chaos"); campaigns: docs/results.md.
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "connex/base/cli.h"
#include "connex/base/json_text.h"
#include "connex/base/signals.h"
#include "connex/base/subprocess.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/cluster.h"
#include "connex/serving/model_name.h"

namespace {

using connex::chaos::CommonOptions;

// The flags of how a campaign runs: binaries, model, backend, timeouts, outputs.
void AddRun(connex::cli::App* app, CommonOptions* o, std::string* json_path, std::string* work_dir,
            bool* keep, bool* quiet, const std::string& bin_dir_names = "--bin-dir") {
  app->add_option("--backend", o->backend, "the stages' data plane: tcp, shm or auto")
      ->check(connex::cli::IsMember({"tcp", "shm", "auto"}))
      ->capture_default_str();
  app->add_option("--model", o->model_path,
                  "checkpoint to serve (default: a small model made with connex-mkmodel)");
  app->add_option(bin_dir_names, o->bin_dir,
                  "where connex-stage and the others are (default: beside connex-chaos)");
  app->add_option("--request-timeout-ms", o->request_timeout_ms,
                  "a request not finished this long counts as failed")
      ->check(connex::cli::Range(int64_t{1000}, int64_t{3'600'000}))
      ->capture_default_str();
  app->add_option("--kv-standby", o->kv_standby,
                  "on: every stage mirrors its KV state to the same stage of the next replica, "
                  "which takes a killed stage's requests over without a re-prefill")
      ->transform(connex::cli::CheckedTransformer(
          std::map<std::string, bool>{{"on", true}, {"off", false}}))
      ->default_str("off");
  app->add_option("--json", *json_path, "write the whole record here");
  app->add_option("--work-dir", *work_dir,
                  "logs, the model and the references (default: a new directory in $TMPDIR, "
                  "removed after a run that passed)");
  app->add_flag("--keep", *keep, "keep the work directory");
  app->add_flag("--quiet", *quiet, "no progress lines");
}

void AddCommon(connex::cli::App* app, CommonOptions* o, std::string* json_path,
               std::string* work_dir, bool* keep, bool* quiet) {
  app->add_option("--replicas", o->replicas, "replica chains")
      ->check(connex::cli::Range(1u, 16u))
      ->capture_default_str();
  app->add_option("--stages", o->stages, "pipeline stages of each chain")
      ->check(connex::cli::Range(1u, 8u))
      ->capture_default_str();
  app->add_option("--max-tokens", o->max_tokens, "tokens generated per request")
      ->check(connex::cli::Range(1, 4096))
      ->capture_default_str();
  app->add_option("--seed", o->seed, "the campaign's choices: prompts, sampling, arrivals")
      ->capture_default_str();
  AddRun(app, o, json_path, work_dir, keep, quiet);
}

// steady and proxy-cost can measure a deployment that runs already.
void AddAttach(connex::cli::App* app, CommonOptions* o) {
  app->add_option("--directory", o->directory,
                  "measure the deployment of this directory instead of starting one (give "
                  "--model, its checkpoint, and --stages)");
  app->add_option("--model-name", o->model_name, "the served model's name (with --directory)")
      ->capture_default_str();
  app->add_option("--proxy-address", o->proxy_address,
                  "HOST:PORT of that deployment's connex-proxy (with --directory)");
}

std::vector<double> ParseDoubles(const std::string& what, const std::string& text) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || v <= 0) {
      throw connex::cli::ValidationError(what,
                                         "\"" + std::string(part) + "\" is not a positive number");
    }
    out.push_back(v);
  }
  return out;
}

std::vector<int> ParseInts(const std::string& what, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1 || v > 64) {
      throw connex::cli::ValidationError(what, "\"" + std::string(part) + "\" is not a K in 1..64");
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  connex::cli::App app{
      "connex-chaos: failover, churn, pd, steady-state, overload, proxy-cost and demo campaigns"};
  app.require_subcommand(1);
  app.fallthrough();  // --log-level also after the campaign
  connex::AddLogLevelFlag(app, "warn");
  CommonOptions common;
  std::string json_path, work_dir;
  bool keep = false, quiet = false;

  connex::chaos::FailoverOptions failover;
  std::string kill_stage = "any", fault = "kill";
  connex::cli::App* f =
      app.add_subcommand("failover", "fault a stage mid-generation, run after run");
  AddCommon(f, &common, &json_path, &work_dir, &keep, &quiet);
  f->add_option("--runs", failover.runs, "fault runs")
      ->check(connex::cli::Range(1, 100000))
      ->capture_default_str();
  f->add_option("--kill-stage", kill_stage, "the stage faulted: any (every stage in turn) or S")
      ->capture_default_str();
  f->add_option("--fault", fault,
                "kill (SIGKILL), stop (SIGSTOP, later SIGCONT), partition, or drain (connexctl "
                "drain: the stage must exit 0 by itself)")
      ->check(connex::cli::IsMember({"kill", "stop", "partition", "drain"}))
      ->capture_default_str();
  f->add_option("--batch", failover.batch, "requests in flight at each fault")
      ->check(connex::cli::Range(1, 256))
      ->capture_default_str();
  f->add_option("--inflight", failover.inflight, "steps in flight per route (K)")
      ->check(connex::cli::Range(1, 64))
      ->capture_default_str();

  connex::chaos::ChurnOptions churn;
  bool no_proxy = false, with_proxy = false;
  connex::cli::App* c =
      app.add_subcommand("churn", "open-loop load while whole replicas go and return");
  AddCommon(c, &common, &json_path, &work_dir, &keep, &quiet);
  c->add_option("--qps", churn.qps, "requests per second (Poisson arrivals)")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  c->add_option("--duration", churn.duration_s, "seconds of load")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  c->add_option("--kill-every", churn.kill_every_s,
                "a replica goes every this many seconds (and is back after half of it)")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  auto* proxy_flag =
      c->add_flag("--proxy", with_proxy, "clients go through connex-proxy (the default)");
  c->add_flag("--no-proxy", no_proxy, "clients go to the live replicas' stage 0 directly")
      ->excludes(proxy_flag);
  c->add_flag("--soft", churn.soft, "a graceful leave (SIGTERM) instead of SIGKILL");

  connex::chaos::PdOptions pd;
  connex::cli::App* pdc = app.add_subcommand(
      "pd",
      "prefill-decode disaggregation under load while instances are killed, beside a "
      "colocated pipeline");
  AddRun(pdc, &common, &json_path, &work_dir, &keep, &quiet);
  uint32_t pd_frontends = 1;
  pdc->add_option("--frontends", pd_frontends, "frontends (the API; the proxy when > 1)")
      ->check(connex::cli::Range(1u, 16u))
      ->capture_default_str();
  pdc->add_option("--prefill", pd.prefill, "prefill instances")
      ->check(connex::cli::Range(1u, 16u))
      ->capture_default_str();
  pdc->add_option("--decode", pd.decode, "decode instances (and colocated chains)")
      ->check(connex::cli::Range(1u, 16u))
      ->capture_default_str();
  pdc->add_option("--max-tokens", common.max_tokens, "tokens generated per request")
      ->check(connex::cli::Range(1, 4096))
      ->capture_default_str();
  pdc->add_option("--seed", common.seed, "the campaign's choices: prompts, sampling, arrivals")
      ->capture_default_str();
  pdc->add_option("--qps", pd.qps, "requests per second (Poisson arrivals)")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  pdc->add_option("--duration", pd.duration_s, "seconds of load (each deployment)")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  pdc->add_option("--kill-every", pd.kill_every_s,
                  "an instance is killed every this many seconds (back after half of it)")
      ->check(connex::cli::NonNegativeNumber)
      ->capture_default_str();
  pdc->add_option("--kill", pd.kill, "which instances: prefill, decode, both (in turn) or none")
      ->check(connex::cli::IsMember({"prefill", "decode", "both", "none"}))
      ->capture_default_str();
  bool no_colocated = false;
  pdc->add_flag("--no-colocated", no_colocated, "skip the colocated pipeline's run");

  connex::chaos::SteadyOptions steady;
  std::string qps_list = "1,2,4", inflight_list = "1,4";
  connex::cli::App* s =
      app.add_subcommand("steady", "latency and throughput per QPS and K, no faults");
  AddCommon(s, &common, &json_path, &work_dir, &keep, &quiet);
  AddAttach(s, &common);
  s->add_option("--qps", qps_list, "open-loop rates, comma-separated")->capture_default_str();
  s->add_option("--inflight", inflight_list, "values of K, comma-separated")->capture_default_str();
  s->add_option("--duration", steady.duration_s, "seconds per rate (and of the closed loop)")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  s->add_option("--clients", steady.closed_loop_clients, "closed-loop clients")
      ->check(connex::cli::Range(1, 256))
      ->capture_default_str();

  connex::chaos::OverloadOptions overload;
  connex::cli::App* ov = app.add_subcommand(
      "overload", "open-loop load past stage 0's KV budget: 429s with Retry-After, /health");
  AddCommon(ov, &common, &json_path, &work_dir, &keep, &quiet);
  ov->add_option("--qps", overload.qps, "requests per second (Poisson arrivals)")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  ov->add_option("--duration", overload.duration_s, "seconds of load")
      ->check(connex::cli::PositiveNumber)
      ->capture_default_str();
  ov->add_option("--kv-budget", overload.kv_budget, "each stage 0's --kv-budget (1M at least)")
      ->check(connex::SizeRange(uint64_t{1} << 20, uint64_t{1} << 44))
      ->capture_default_str();
  ov->add_option("--queue-max", overload.queue_max, "each stage 0's --queue-max")
      ->check(connex::cli::Range(0, 1 << 20))
      ->capture_default_str();

  connex::chaos::ProxyCostOptions proxy_cost;
  connex::cli::App* p =
      app.add_subcommand("proxy-cost", "the same requests direct and via the proxy");
  AddCommon(p, &common, &json_path, &work_dir, &keep, &quiet);
  AddAttach(p, &common);
  p->add_option("--requests", proxy_cost.requests, "requests per path, one at a time")
      ->check(connex::cli::Range(1, 100000))
      ->capture_default_str();

  connex::chaos::DemoOptions demo;
  bool demo_no_proxy = false;
  connex::cli::App* dm = app.add_subcommand(
      "demo", "make demo: load through the proxy, a middle stage and a stage 0 SIGKILLed");
  AddRun(dm, &common, &json_path, &work_dir, &keep, &quiet, "--bin-dir,--bin");
  dm->add_option("--clients", demo.clients, "concurrent streaming clients")
      ->check(connex::cli::Range(1, 64))
      ->capture_default_str();
  dm->add_flag("--no-proxy", demo_no_proxy,
               "debugging: clients use the stage-0 replicas directly, and no stage 0 is killed");
  dm->add_option("--phase", demo.phase_s,
                 "seconds of load before the first kill, between the kills, after the last")
      ->check(connex::cli::Range(1.0, 600.0))
      ->capture_default_str();

  if (std::optional<int> code = connex::ParseFlags(app, argc, argv, [&] {
        if (f->parsed()) {
          if (kill_stage != "any") {
            int v = -1;
            if (!absl::SimpleAtoi(kill_stage, &v) || v < 0) {
              throw connex::cli::ValidationError(
                  "--kill-stage", "\"" + kill_stage + "\": expected any or a stage number");
            }
            failover.kill_stage = v;
          }
        }
        if (s->parsed()) {
          steady.qps = ParseDoubles("--qps", qps_list);
          steady.inflight = ParseInts("--inflight", inflight_list);
        }
        if (dm->parsed()) {
          // What make demo runs must be there: say so before anything starts.
          const std::string dir = common.bin_dir.empty() ? connex::BinDir() : common.bin_dir;
          for (const char* bin : {"connex-mkmodel", "connex-directory", "connex-stage",
                                  "connex-proxy", "connex-generate"}) {
            if (access((dir + "/" + bin).c_str(), X_OK) != 0) {
              throw connex::cli::ValidationError(
                  "--bin-dir", dir + ": no executable " + bin + " (make demo builds what it runs)");
            }
          }
        }
      })) {
    return *code;
  }
  common.progress = !quiet;
  if (common.bin_dir.empty()) common.bin_dir = connex::BinDir();
  const bool made_work_dir = work_dir.empty();
  if (made_work_dir) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/connex-chaos-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::perror("connex-chaos: mkdtemp");
      return 1;
    }
    work_dir = templ;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(work_dir, ec);
    if (ec) {
      std::cerr << "connex-chaos: --work-dir " << work_dir << ": " << ec.message() << "\n";
      return 2;
    }
  }
  common.work_dir = work_dir;
  // A deployment of its own serves --model under the name connex-stage would give it (the model
  // directory's name, say), as a user's deployment would; "tiny" for the model it makes itself.
  if (common.directory.empty() && !common.model_path.empty()) {
    common.model_name = connex::serving::ServedModelName(common.model_path);
  }

  // The campaign runs on its own thread; this one takes SIGINT/SIGTERM and, on one, removes what
  // the campaign made (its children die with it: PR_SET_PDEATHSIG).
  const connex::TerminationSignals signals;
  std::atomic<bool> finished{false};
  int exit_code = 1;
  std::thread campaign([&] {
    absl::StatusOr<nlohmann::json> record = absl::InternalError("no campaign");
    if (f->parsed()) {
      absl::StatusOr<connex::chaos::Fault> which = connex::chaos::ParseFault(fault);
      failover.common = common;
      if (which.ok()) failover.fault = *which;
      record = which.ok() ? connex::chaos::RunFailover(failover)
                          : absl::StatusOr<nlohmann::json>(which.status());
    } else if (c->parsed()) {
      churn.common = common;
      churn.proxy = !no_proxy;
      record = connex::chaos::RunChurn(churn);
    } else if (s->parsed()) {
      steady.common = common;
      record = connex::chaos::RunSteady(steady);
    } else if (p->parsed()) {
      proxy_cost.common = common;
      record = connex::chaos::RunProxyCost(proxy_cost);
    } else if (ov->parsed()) {
      overload.common = common;
      record = connex::chaos::RunOverload(overload);
    } else if (pdc->parsed()) {
      pd.common = common;
      pd.common.replicas = pd_frontends;
      pd.colocated = !no_colocated;
      record = connex::chaos::RunPd(pd);
    } else if (dm->parsed()) {
      demo.common = common;
      demo.proxy = !demo_no_proxy;
      record = connex::chaos::RunDemo(demo);
    }
    if (!record.ok()) {
      std::cerr << "connex-chaos: " << record.status().message() << " (logs in " << work_dir
                << ")\n";
      exit_code = record.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
      keep = true;
    } else {
      std::string command;
      for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
      (*record)["command"] = command;
      std::cout << connex::chaos::Summary(*record);
      std::cout.flush();
      if (!json_path.empty()) {
        std::ofstream out(json_path, std::ios::trunc);
        out << connex::DumpJson(*record, 2) << "\n";
        if (!out) std::cerr << "connex-chaos: cannot write " << json_path << "\n";
      }
      exit_code = record->value("ok", false) ? 0 : 1;
      if (exit_code != 0) keep = true;
    }
    finished.store(true);
  });
  while (!finished.load()) {
    if (int sig = signals.WaitFor(100); sig != 0) {
      std::cerr << "connex-chaos: signal " << sig << ", stopping\n";
      connex::chaos::RemoveNetworksOfThisProcess();
      std::_Exit(130);  // the campaign thread and every process it started go with it
    }
  }
  campaign.join();
  if (keep) {
    std::cerr << "connex-chaos: logs in " << work_dir << "\n";
  } else if (made_work_dir) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir, ec);
  }
  return exit_code;
}
