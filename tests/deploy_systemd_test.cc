// deploy/systemd started as written: each unit's ExecStart with its EnvironmentFiles (parsed as
// systemd parses them, tests/systemd_unit.h) runs inside a namespace host at the address its
// environment file names — the directory on 10.77.0.10, two stages on 10.77.0.11, the proxy on
// 10.77.0.12 — with keys made by `connexctl keygen` (mode 600) and a token file. Only the install
// root moves: /etc/connex, /opt/connex, /srv/connex and /var/lib are under a temporary directory.
// Each must come up (its listening / ready line, /health, the directory's records) and a
// completion through the proxy must equal connex-generate's tokens. Label hosts.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/chaos/cluster.h"
#include "connex/chaos/hosts.h"
#include "connex/chaos/http_client.h"
#include "connex/chaos/reference.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/systemd_unit.h"

namespace connex::testing {
namespace {

namespace fs = std::filesystem;
using chaos::Hosts;

const std::string kUnits = std::string(CONNEX_SOURCE_DIR) + "/deploy/systemd";

class DeploySystemdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = Hosts::Available(); !s.ok()) {
      GTEST_SKIP() << "namespace hosts cannot be made here: " << s.message();
    }
    root_ = StrCat(::testing::TempDir(), "/deploy-systemd-", getpid());
    fs::remove_all(root_);
    for (const char* d : {"/etc/connex", "/opt/connex", "/srv/connex/models/tiny", "/var/lib"}) {
      fs::create_directories(root_ + d);
    }
    fs::create_symlink(BinDir(), root_ + "/opt/connex/bin");
    // The environment files, installed where the units read them.
    for (const auto& f : fs::directory_iterator(kUnits)) {
      if (f.path().extension() == ".env") {
        fs::copy_file(f.path(), root_ + "/etc/connex/" + f.path().filename().string());
      }
    }
    chaos::HostsOptions o;
    o.hosts = 3;
    o.subnet = 0;  // the units' addresses: 10.77.0.10 .. 12
    o.work_dir = root_;
    absl::StatusOr<std::unique_ptr<Hosts>> h = Hosts::Make(o);
    ASSERT_TRUE(h.ok()) << h.status();
    hosts_ = std::move(*h);
  }
  void TearDown() override {
    hosts_.reset();
    if (!HasFailure()) fs::remove_all(root_);
  }

  std::string Map(const std::string& s) const {
    for (const char* prefix : {"/etc/connex", "/opt/connex", "/srv/connex", "/var/lib/"}) {
      if (s.rfind(prefix, 0) == 0) return root_ + s;
    }
    return s;
  }
  // Runs a unit on `host` as systemd would; the handle.
  int StartUnit(int host, const std::string& unit, const std::string& instance = "",
                const std::vector<std::string>& drop = {}) {
    absl::StatusOr<SystemdService> service = ParseServiceUnit(
        kUnits + "/" + unit, instance, [this](const std::string& s) { return Map(s); });
    EXPECT_TRUE(service.ok()) << service.status();
    if (!service.ok()) return -1;
    SubprocessOptions so;
    for (const std::string& e : service->environment) {
      bool dropped = false;
      for (const std::string& d : drop) dropped |= e.rfind(d + "=", 0) == 0;
      if (!dropped) so.env.push_back(e);
    }
    // StateDirectory= of the directory's unit: systemd makes /var/lib/NAME before the start.
    fs::create_directories(root_ + "/var/lib/connex-directory");
    absl::StatusOr<int> p = hosts_->Start(host, unit + (instance.empty() ? "" : "-" + instance),
                                          service->exec_start, so);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : -1;
  }
  std::string WaitLine(int handle, const std::string& needle) {
    std::optional<std::string> line = hosts_->process(handle).WaitForLine(needle, 60'000);
    if (!line) {
      std::optional<int> code = hosts_->process(handle).Wait(0);
      ADD_FAILURE() << "no \"" << needle << "\" line"
                    << (code ? StrCat(" (exited ", *code, ")") : "") << "; see "
                    << hosts_->log_path(handle);
      return "";
    }
    return *line;
  }
  // Keys and token as deploy.md says to make them.
  void MakeSecrets() {
    SubprocessOptions so;
    so.capture_stderr = true;
    std::optional<Subprocess> k = Subprocess::Start(
        {BinDir() + "/connexctl", "keygen", "--out", root_ + "/etc/connex/deploy"}, so);
    ASSERT_TRUE(k);
    while (k->ReadLine(10'000)) {
    }
    ASSERT_EQ(k->Wait(10'000), 0) << k->transcript();
    struct stat st;
    ASSERT_EQ(stat((root_ + "/etc/connex/deploy.key").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    const std::string token = root_ + "/etc/connex/token";
    std::ofstream(token) << "a-token-of-this-test-" << getpid() << "\n";
    chmod(token.c_str(), 0600);
  }
  std::string root_;
  std::unique_ptr<Hosts> hosts_;
};

TEST_F(DeploySystemdTest, EveryUnitStartsAsWrittenAndServesExactTokens) {
  ASSERT_NO_FATAL_FAILURE(MakeSecrets());
  ASSERT_TRUE(chaos::MakeModel(BinDir(), root_ + "/srv/connex/models/tiny/model.safetensors",
                               {"--layers", "4", "--dim", "64", "--seed", "3"})
                  .ok());
  const int dir = StartUnit(0, "connex-directory.service");
  ASSERT_GE(dir, 0);
  EXPECT_NE(WaitLine(dir, "listening").find("bind=tcp://10.77.0.10:7300"), std::string::npos);
  const int s1 = StartUnit(1, "connex-stage@.service", "1-0");
  const int s0 = StartUnit(1, "connex-stage@.service", "0-0");
  ASSERT_NE(WaitLine(s1, "ready "), "");
  ASSERT_NE(WaitLine(s0, "ready "), "");
  const int proxy = StartUnit(2, "connex-proxy.service");
  EXPECT_NE(WaitLine(proxy, "listening http=").find("10.77.0.12:8000"), std::string::npos);

  const chaos::HostPort api{"10.77.0.11", 8001}, front{"10.77.0.12", 8000};
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<chaos::HttpReply> r = chaos::HttpGet(api, "/health", 2000);
        return r.ok() && r->status == 200;
      },
      60'000, 50))
      << "stage 0 never healthy; see " << hosts_->log_path(s0);
  // The directory's records, read with the deployment's key and token (connexctl from here).
  SubprocessOptions so;
  so.capture_stderr = true;
  so.env = {"CONNEX_CURVE_KEY_FILE=" + root_ + "/etc/connex/deploy.key",
            "CONNEX_DIRECTORY_TOKEN_FILE=" + root_ + "/etc/connex/token"};
  std::optional<Subprocess> status = Subprocess::Start(
      {BinDir() + "/connexctl", "--directory", "tcp://10.77.0.10:7300", "status"}, so);
  ASSERT_TRUE(status);
  while (status->ReadLine(20'000)) {
  }
  EXPECT_EQ(status->Wait(20'000), 0) << status->transcript();
  EXPECT_NE(status->transcript().find("tiny/g0/s0/r0"), std::string::npos) << status->transcript();
  EXPECT_NE(status->transcript().find("tiny/g1/s0/r0"), std::string::npos) << status->transcript();
  std::printf("connexctl status:\n%s\n", status->transcript().c_str());

  // Through the proxy, against connex-generate.
  chaos::RequestSpec spec;
  spec.prompt = "Hello from the units";
  spec.max_tokens = 12;
  chaos::References refs(BinDir() + "/connex-generate",
                         root_ + "/srv/connex/models/tiny/model.safetensors", 2, root_);
  ASSERT_TRUE(refs.Compute({spec}).ok());
  bool proxy_ready = WaitUntil(
      [&] {
        absl::StatusOr<chaos::HttpReply> r = chaos::HttpGet(front, "/health", 2000);
        return r.ok() && r->status == 200;
      },
      60'000, 50);
  ASSERT_TRUE(proxy_ready) << "proxy never healthy; see " << hosts_->log_path(proxy);
  chaos::StreamResult got = chaos::StreamCompletion(front, spec.Body("tiny"), 30'000, 60'000);
  ASSERT_TRUE(got.ok()) << got.error;
  EXPECT_EQ(got.tokens, refs.Find(spec)->tokens);
  for (int h : {dir, s0, s1, proxy}) EXPECT_TRUE(hosts_->running(h)) << hosts_->log_path(h);
}

// What made the units of docs/deploy.md fail: a directory on a non-loopback address without a
// CURVE key (or --insecure) exits 2 at start — the test above would see it.
TEST_F(DeploySystemdTest, AUnitWithoutItsKeyDoesNotStartAndSaysWhy) {
  ASSERT_NO_FATAL_FAILURE(MakeSecrets());
  const int dir = StartUnit(0, "connex-directory.service", "", {"CONNEX_CURVE_KEY_FILE"});
  ASSERT_GE(dir, 0);
  std::optional<int> code = hosts_->process(dir).Wait(30'000);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  std::ifstream log(hosts_->log_path(dir));
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  std::printf("connex-directory without its key:\n%s\n", text.c_str());
  EXPECT_NE(text.find("10.77.0.10"), std::string::npos) << text;
}

}  // namespace
}  // namespace connex::testing
