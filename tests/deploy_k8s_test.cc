// deploy/k8s: every container command names a binary that exists and only flags that binary
// accepts — each `--flag` of a `command:` is checked against the binary's own `--help` (the
// project's binaries from this build, etcd from etcd-server). Label hosts.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "connex/base/subprocess.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::testing {
namespace {

const std::string kManifests = std::string(CONNEX_SOURCE_DIR) + "/deploy/k8s";

// The flags `binary --help` lists.
std::set<std::string> HelpFlags(const std::string& binary) {
  SubprocessOptions so;
  so.capture_stderr = true;
  std::optional<Subprocess> p = Subprocess::Start({binary, "--help"}, so);
  std::set<std::string> flags;
  if (!p) return flags;
  while (p->ReadLine(20'000)) {
  }
  p->Wait(20'000);
  const std::string help = p->transcript();
  std::regex flag("--[a-z0-9][a-z0-9-]*");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), flag); it != std::sregex_iterator();
       ++it) {
    flags.insert(it->str());
  }
  return flags;
}

// Where a manifest's binary is here: /opt/connex/bin/X is this build's X; others as they are.
std::string Local(const std::string& path) {
  const std::string prefix = "/opt/connex/bin/";
  if (path.rfind(prefix, 0) == 0) return BinDir() + "/" + path.substr(prefix.size());
  return path;
}

TEST(DeployK8sTest, EveryContainerCommandUsesFlagsItsBinaryAccepts) {
  int commands = 0;
  std::map<std::string, std::set<std::string>> help;
  for (const auto& f : std::filesystem::directory_iterator(kManifests)) {
    if (f.path().extension() != ".yaml") continue;
    std::ifstream in(f.path());
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      const size_t at = line.find("command:");
      if (at == std::string::npos || line.find_first_not_of(' ') != at) continue;
      const std::string where = f.path().filename().string() + ":" + std::to_string(n);
      nlohmann::json argv = nlohmann::json::parse(line.substr(at + 8), nullptr, false);
      ASSERT_TRUE(argv.is_array() && !argv.empty())
          << where << ": a command must be a one-line flow sequence of double-quoted strings";
      ++commands;
      const std::string binary = Local(argv[0].get<std::string>());
      if (access(binary.c_str(), X_OK) != 0) {
        ADD_FAILURE() << where << ": " << argv[0] << " is not here (" << binary << ")";
        continue;
      }
      if (!help.count(binary)) help[binary] = HelpFlags(binary);
      ASSERT_FALSE(help[binary].empty()) << binary << " --help lists no flag";
      for (size_t i = 1; i < argv.size(); ++i) {
        std::string word = argv[i].get<std::string>();
        if (word.rfind("--", 0) != 0) continue;
        word = word.substr(0, word.find('='));
        EXPECT_TRUE(help[binary].count(word))
            << where << ": " << word << " is not a flag of " << argv[0] << " (its --help)";
      }
    }
  }
  EXPECT_GE(commands, 5) << "etcd, the model maker and the stages of stages.yaml, the proxy";
}

}  // namespace
}  // namespace connex::testing
