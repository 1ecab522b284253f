#include "tests/serving_e2e_fixture.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "connex/base/subprocess.h"
#include "connex/base/wait.h"
#include "connex/serving/testing/http_client.h"
#include "nlohmann/json.hpp"

namespace connex::testing {

using serving::testing::TestConnection;

std::shared_ptr<chaos::Outcome> Streams::Start(const chaos::RequestSpec& spec,
                                               const chaos::HostPort& at,
                                               const std::string& target) {
  load_.set_model(kModelName);
  load_.Issue(next_++, spec, at, target, -1, 120'000);
  return load_.Outcomes().back();  // only this thread issues
}

bool Streams::WaitForTokens(int n, int64_t timeout_ms) {
  return WaitUntil(
      [&] {
        for (const auto& o : load_.Outcomes()) {
          const chaos::LiveStream::View v = o->live.Get();
          if (v.tokens < n && !v.ended) return false;
        }
        return true;
      },
      timeout_ms);
}

std::string* ServingE2eTest::dir_ = nullptr;

void ServingE2eTest::SetUpTestSuite() {
  dir_ = new std::string(::testing::TempDir() + "/serving-e2e-" + std::to_string(getpid()));
  std::filesystem::create_directories(*dir_ + "/" + kModelName);
  absl::Status made = chaos::MakeModel(BinDir(), ModelPath(),
                                       {"--layers", "3", "--dim", "64", "--heads", "4",
                                        "--kv-heads", "2", "--ffn", "128", "--seed", "11"});
  ASSERT_TRUE(made.ok()) << made;
}

void ServingE2eTest::TearDownTestSuite() {
  std::filesystem::remove_all(*dir_);
  delete dir_;
  dir_ = nullptr;
}

std::string ServingE2eTest::ModelPath() { return *dir_ + "/" + kModelName + "/model.safetensors"; }

void ServingE2eTest::SetUp() {
  work_dir_ = *dir_ + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(work_dir_);
  chaos::ClusterOptions o;
  o.bin_dir = BinDir();
  o.work_dir = work_dir_;
  o.model_path = ModelPath();
  o.model_name = kModelName;
  o.replicas = 2;
  o.stages = kStages;
  o.backend = "auto";  // the stages' own choice of data plane
  // The directory's lease and the stages' step and probe timeouts are the Cluster's short ones,
  // so that a killed stage is found within a second; the proxy's idle timeout is its own.
  o.proxy_idle_timeout_ms = 0;
  // A short HTTP read timeout, so that the slow-client test sees its 408 soon.
  o.stage_env = {"CONNEX_HTTP_READ_TIMEOUT_MS=2000"};
  o.proxy_env = {"CONNEX_HTTP_READ_TIMEOUT_MS=2000"};
  o.start_timeout_ms = 20'000;
  Configure(o);
  absl::StatusOr<std::unique_ptr<chaos::Cluster>> cluster = chaos::Cluster::Start(std::move(o));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);
  references_.emplace(BinDir() + "/connex-generate", ModelPath(), kStages, work_dir_);
}

void ServingE2eTest::TearDown() {
  if (HasFailure()) PrintLogs();
  cluster_.reset();
}

// The end of every log of the deployment, for a test that failed (its processes' stderr goes to
// files).
void ServingE2eTest::PrintLogs() {
  for (const auto& entry : std::filesystem::directory_iterator(work_dir_)) {
    if (entry.path().extension() != ".log") continue;
    std::ifstream in(entry.path());
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    const size_t from = lines.size() > 20 ? lines.size() - 20 : 0;
    std::string tail;
    for (size_t i = from; i < lines.size(); ++i) tail += "  " + lines[i] + "\n";
    std::printf("--- %s (last %zu lines)\n%s", entry.path().c_str(), lines.size() - from,
                tail.c_str());
  }
}

double ServingE2eTest::ProxyMetric(const std::string& name) {
  TestConnection c(proxy_port(), 60000);
  if (!c.Send("GET", "/metrics")) return -1;
  auto r = c.Read();
  if (!r) return -1;
  std::smatch m;
  std::string body = r->body();
  if (!std::regex_search(body, m, std::regex("\n" + name + " ([0-9.e+]+)"))) return 0;
  return std::stod(m[1]);
}

double ServingE2eTest::MetricSum(uint16_t port, const std::string& name) {
  TestConnection c(port, 60000);
  if (!c.Send("GET", "/metrics")) return -1;
  auto r = c.Read();
  if (!r) return -1;
  const std::string body = r->body();
  const std::regex series("\n" + name + "(\\{[^}]*\\})? ([0-9.e+]+)");
  double sum = 0;
  for (std::sregex_iterator it(body.begin(), body.end(), series), end; it != end; ++it) {
    sum += std::stod((*it)[2]);
  }
  return sum;
}

std::string ServingE2eTest::HeldAnywhere() {
  std::string held;
  for (int replica = 0; replica < 2; ++replica) {
    for (int stage = 0; stage < kStages; ++stage) {
      TestConnection c(metrics_port(stage, replica), 60000);
      if (!c.Send("GET", "/metrics")) return "no answer";
      auto r = c.Read();
      if (!r) return "no answer";
      const std::string body = r->body();
      for (const std::string name :
           {"connex_stage_held_requests", "connex_stage_requests_in_flight"}) {
        std::smatch m;
        if (!std::regex_search(body, m, std::regex("\n" + name + " ([0-9]+)"))) {
          held += " (no " + name + ")";
        } else if (m[1] != "0") {
          held += " stage " + std::to_string(stage) + "/r" + std::to_string(replica) + " " + name +
                  "=" + std::string(m[1]);
        }
      }
    }
  }
  return held;
}

std::pair<int, std::string> ServingE2eTest::Request(int replica, const std::string& method,
                                                    const std::string& target,
                                                    const std::string& body) {
  TestConnection c(http_port(replica), 60000);
  if (!c.Send(method, target, body)) return {0, ""};
  auto r = c.Read();
  if (!r) return {0, ""};
  return {static_cast<int>(r->result_int()), r->body()};
}

chaos::Reference ServingE2eTest::Want(const chaos::RequestSpec& spec) {
  absl::Status s = references_->Compute({spec});
  EXPECT_TRUE(s.ok()) << s;
  const chaos::Reference* want = references_->Find(spec);
  return want != nullptr ? *want : chaos::Reference{};
}

std::optional<chaos::RequestSpec> ServingE2eTest::RunningFullLength(
    const std::function<chaos::RequestSpec(int)>& candidate, int tries) {
  for (int k = 0; k < tries; ++k) {
    chaos::RequestSpec spec = candidate(k);
    if (Want(spec).tokens.size() == static_cast<size_t>(spec.max_tokens)) return spec;
  }
  ADD_FAILURE() << "none of " << tries << " requests like \"" << candidate(0).prompt << "\" runs "
                << candidate(0).max_tokens << " tokens";
  return std::nullopt;
}

std::shared_ptr<chaos::Outcome> ServingE2eTest::WholeOutcome(const chaos::RequestSpec& spec,
                                                             const std::string& target, int status,
                                                             const std::string& body) {
  auto o = std::make_shared<chaos::Outcome>();
  o->spec = spec;
  o->target = target;
  chaos::StreamResult& r = o->result;
  r.http_status = status;
  if (status != 200) {
    r.error = "HTTP " + std::to_string(status) + ": " + body.substr(0, 200);
    return o;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(body);
    const nlohmann::json& choice = j.at("choices").at(0);
    r.tokens = choice.at("token_ids").get<std::vector<int32_t>>();
    r.text = choice.contains("message") ? choice["message"].at("content").get<std::string>()
                                        : choice.at("text").get<std::string>();
    r.finish_reason = choice.at("finish_reason").get<std::string>();
    r.response_ids = {j.at("id").get<std::string>()};
    r.prompt_tokens = j.at("usage").at("prompt_tokens").get<int64_t>();
    r.completion_tokens = j.at("usage").at("completion_tokens").get<int64_t>();
    r.total_tokens = j.at("usage").at("total_tokens").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    r.error = std::string("not a completion (") + e.what() + "): " + body.substr(0, 200);
  }
  return o;
}

void ServingE2eTest::ExpectCorrect(std::vector<std::shared_ptr<chaos::Outcome>> outcomes) {
  absl::Status checked = chaos::Check(*references_, outcomes);
  ASSERT_TRUE(checked.ok()) << checked;
  for (const auto& o : outcomes) {
    SCOPED_TRACE(o->spec.prompt + " (" + o->target + ")");
    if (!o->result.ok()) {
      ADD_FAILURE() << "did not complete: " << o->result.error;
      continue;
    }
    if (o->correct) continue;
    const chaos::Reference* want = references_->Find(o->spec);
    ADD_FAILURE() << "not connex-generate's answer: " << chaos::Differences(*o);
    if (want != nullptr) {
      EXPECT_EQ(o->result.tokens, want->tokens);
    }
  }
}

}  // namespace connex::testing
