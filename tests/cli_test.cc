// Every binary as a user runs it with bad flags: each case that used to crash, hang, exit with
// CLI11's own codes (105..114) or silently misbehave is a clear message naming the flag and exit
// code 2. And every flag and variable a binary's --help shows is in docs/configuration.md ("a
// flag not in that file does not exist").
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "connex/base/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::testing {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  std::optional<int> code;  // nullopt: still running at the deadline (killed)
  std::string out;          // stdout and stderr
};

// Runs `args` (args[0] names a binary of BinDir()) to its exit, at most `timeout_ms`.
Outcome RunBinary(std::vector<std::string> args, std::vector<std::string> env = {},
                  int64_t timeout_ms = 60000) {
  args[0] = BinDir() + "/" + args[0];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
  };
  std::optional<Subprocess> p = Subprocess::Start(args, env, /*capture_stderr=*/true);
  if (!p) return {};
  while (p->ReadLine(left())) {
  }
  Outcome run;
  run.code = p->Wait(left());
  run.out = p->transcript();
  return run;
}

std::string Joined(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += a + " ";
  return out;
}

// Asserts that `args` is refused as a usage error: exit 2, a message naming `flag` (and `also`).
void ExpectUsageError(const std::vector<std::string>& args, const std::string& flag,
                      const std::string& also = "", std::vector<std::string> env = {}) {
  Outcome r = RunBinary(args, env);
  ASSERT_TRUE(r.code.has_value()) << Joined(args) << ": still running (hung?)\n" << r.out;
  EXPECT_EQ(*r.code, 2) << Joined(args) << "\n" << r.out;
  EXPECT_THAT(r.out, HasSubstr(flag)) << Joined(args);
  if (!also.empty()) {
    EXPECT_THAT(r.out, HasSubstr(also)) << Joined(args);
  }
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/cli-test." + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(CliTest, BenchRefusesWhatUsedToCrashOrHang) {
  // Segfault (max of no delays), uncaught std::system_error, a hang, and values the variables
  // behind the flags refuse.
  ExpectUsageError({"connex-bench", "peer-death", "--runs", "0"}, "--runs");
  ExpectUsageError({"connex-bench", "transport", "--inflight", "100000"}, "--inflight");
  ExpectUsageError({"connex-bench", "transport", "--inflight", "0"}, "--inflight");
  ExpectUsageError({"connex-bench", "transport", "--tcp-connections", "0"}, "--tcp-connections");
  ExpectUsageError({"connex-bench", "peer-death", "--heartbeat-ms", "0"}, "--heartbeat-ms");
  ExpectUsageError({"connex-bench", "transport", "--suspect-ms", "0"}, "--suspect-ms");
  ExpectUsageError({"connex-bench", "transport", "--spin-us", "-1"}, "--spin-us");
  ExpectUsageError({"connex-bench", "transport", "--seconds", "-1"}, "--seconds");
  ExpectUsageError({"connex-bench", "memcpy", "--seconds", "0"}, "--seconds");
  ExpectUsageError({"connex-bench", "transport", "--backend", "carrier-pigeon"}, "--backend");
  // bad_alloc: a size over the limit names the flag and the limit.
  ExpectUsageError({"connex-bench", "memcpy", "--sizes", "100G"}, "--sizes", "4294967296");
  ExpectUsageError({"connex-bench", "memcpy", "--sizes", "4K,0"}, "--sizes");
  ExpectUsageError({"connex-bench", "transport", "--sizes", "4K,lots"}, "--sizes");
  ExpectUsageError({"connex-bench", "serve", "--size", "100G"}, "--size", "4294967296");
  // The variables behind the flags are checked as the flags are.
  ExpectUsageError({"connex-bench", "transport"}, "--tcp-connections", "",
                   {"CONNEX_TRANSPORT_TCP_CONNECTIONS=0"});
  // CLI11's own exit codes (106, 109) are now 2.
  ExpectUsageError({"connex-bench", "transport", "--no-such-flag"}, "--no-such-flag");
  ExpectUsageError({"connex-bench"}, "subcommand");
}

// connexctl does not link gRPC: an etcd:// address loads the etcd plugin from beside the program
// (or CONNEX_PLUGIN_DIR). A copy of connexctl in a folder without it says where it looked; told
// where it is, the backend loads and only the absent etcd is an error.
TEST_F(CliTest, EtcdAddressesLoadThePluginOrSayWhereItWasLookedFor) {
  if (!CONNEX_HAVE_ETCD) GTEST_SKIP() << "built with -DCONNEX_ETCD=OFF";
  const std::string copy = dir_ + "/connexctl";
  std::filesystem::copy_file(BinDir() + "/connexctl", copy);
  std::filesystem::permissions(copy, std::filesystem::perms::owner_all);
  auto run = [&](std::vector<std::string> env) {
    std::optional<Subprocess> p =
        Subprocess::Start({copy, "--directory", "etcd://127.0.0.1:9", "status"}, env, true);
    Outcome r;
    if (!p) return r;
    while (p->ReadLine(60000)) {
    }
    r.code = p->Wait(60000);
    r.out = p->transcript();
    return r;
  };
  Outcome missing = run({});
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_THAT(missing.out,
              HasSubstr("the etcd backend libconnex-etcd.so is not installed (tried " +
                        std::filesystem::canonical(dir_).string() + "/libconnex-etcd.so (absent)"));
  EXPECT_THAT(missing.out, HasSubstr("set CONNEX_PLUGIN_DIR"));
  Outcome loaded = run({"CONNEX_PLUGIN_DIR=" + BinDir()});
  EXPECT_EQ(loaded.code, 1) << loaded.out;
  EXPECT_THAT(loaded.out, HasSubstr("etcd: Range: no member answered")) << "the plugin ran";
  EXPECT_THAT(loaded.out, ::testing::Not(HasSubstr("not installed")));
}

TEST_F(CliTest, MkmodelRefusesACheckpointTooLargeToBuild) {
  ExpectUsageError({"connex-mkmodel", "--out", dir_ + "/huge.safetensors", "--layers", "1024",
                    "--dim", "65536", "--ffn", "262144"},
                   "--layers", "over the limit of 17179869184 bytes");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/huge.safetensors"));
  ExpectUsageError({"connex-mkmodel", "--out", dir_ + "/m.safetensors", "--layers", "0"},
                   "--layers");
  ExpectUsageError({"connex-mkmodel", "--out", dir_ + "/m.safetensors", "--dim", "100000"},
                   "--dim");
  ExpectUsageError({"connex-mkmodel", "--out", dir_ + "/m.safetensors", "--vocab", "10"},
                   "--vocab");
  ExpectUsageError({"connex-mkmodel", "--out", dir_ + "/m.safetensors", "--rope-theta", "-5"},
                   "--rope-theta");
}

TEST_F(CliTest, GenerateRefusesADirectoryOfPromptsAndAMisdeclaredHeader) {
  const std::string model = dir_ + "/model.safetensors";
  Outcome mk = RunBinary({"connex-mkmodel", "--out", model, "--layers", "1", "--dim", "16",
                          "--heads", "2", "--kv-heads", "1", "--ffn", "16"});
  ASSERT_EQ(mk.code, 0) << mk.out;
  ExpectUsageError({"connex-generate", "--model", model, "--prompts-file", dir_}, "--prompts-file",
                   "is a directory");

  // The header length one byte short: the data section would start a byte early.
  std::string bytes;
  {
    std::ifstream in(model, std::ios::binary);
    std::stringstream all;
    all << in.rdbuf();
    bytes = all.str();
  }
  ASSERT_GT(bytes.size(), 8u);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[i]);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length - 1) >> (8 * i));
  const std::string shifted = dir_ + "/short-header.safetensors";
  std::ofstream(shifted, std::ios::binary) << bytes;
  ExpectUsageError({"connex-generate", "--model", shifted, "--prompt", "x"},
                   "short-header.safetensors");
  Outcome ok =
      RunBinary({"connex-generate", "--model", model, "--prompt", "x", "--max-tokens", "2"});
  EXPECT_EQ(ok.code, 0) << ok.out;
}

// The binaries of apps/, bench/, examples/ and the test node, with a command line that shows
// each one's flags (binaries with sub-commands: once per sub-command).
// Whether this build has `binary`: the benchmarks are left out by -DCONNEX_BUILD_BENCHMARKS=OFF,
// bench_directory (etcd beside the embedded directory) by -DCONNEX_ETCD=OFF too.
bool Built(const std::string& binary) {
  if (binary.rfind("bench_", 0) == 0 && !CONNEX_HAVE_BENCHMARKS) return false;
  if (binary == "bench_directory" && !CONNEX_HAVE_ETCD) return false;
  return true;
}

const std::vector<std::vector<std::string>>& HelpCommands() {
  static const auto* commands = new std::vector<std::vector<std::string>>{
      {"connex-bench", "--help"},
      {"connex-bench", "transport", "--help"},
      {"connex-bench", "peer-death", "--help"},
      {"connex-bench", "memcpy", "--help"},
      {"connex-bench", "serve", "--help"},
      {"connex-chaos", "--help"},
      {"connex-chaos", "failover", "--help"},
      {"connex-chaos", "churn", "--help"},
      {"connex-chaos", "steady", "--help"},
      {"connex-chaos", "proxy-cost", "--help"},
      {"connex-chaos", "overload", "--help"},
      {"connex-directory", "--help"},
      {"connex-generate", "--help"},
      {"connex-mkmodel", "--help"},
      {"connex-proxy", "--help"},
      {"connex-stage", "--help"},
      {"connexctl", "--help"},
      {"connexctl", "status", "--help"},
      {"connexctl", "serving", "--help"},
      {"connexctl", "watch", "--help"},
      {"connexctl", "resolve", "--help"},
      {"connexctl", "join", "--help"},
      {"connexctl", "leave", "--help"},
      {"connexctl", "report-failed", "--help"},
      {"bench_directory", "--help"},
      {"bench_handover", "--help"},
      {"bench_pp_memory", "--help"},
      {"pp_test_node", "--help"},
      {"mobile_endpoints", "--help"},
      {"two_stage_pipeline", "--help"},
  };
  static const auto* built = [] {
    auto* kept = new std::vector<std::vector<std::string>>();
    for (const auto& command : *commands) {
      if (Built(command[0])) kept->push_back(command);
    }
    return kept;
  }();
  return *built;
}

TEST_F(CliTest, EveryBinaryValidatesLogLevelAndExitsTwoOnUsageErrors) {
  std::set<std::string> binaries;
  for (const auto& command : HelpCommands()) binaries.insert(command[0]);
  for (const std::string& binary : binaries) {
    SCOPED_TRACE(binary);
    // The command line of `binary` with `args` (and the sub-command the binary needs).
    auto command = [&binary](std::vector<std::string> args) {
      args.insert(args.begin(), binary);
      if (binary == "connex-bench") args.push_back("memcpy");
      if (binary == "connexctl") args.push_back("status");
      if (binary == "connex-chaos") args.push_back("proxy-cost");
      // Required flags are checked before unknown ones.
      if (binary == "connex-mkmodel") args.insert(args.end(), {"--out", "unused"});
      if (binary == "connex-generate")
        args.insert(args.end(), {"--model", "unused", "--prompt", "x"});
      if (binary == "connex-stage")
        args.insert(args.end(), {"--model", "unused", "--stage", "0", "--stages", "1"});
      if (binary == "connex-proxy") args.insert(args.end(), {"--model", "unused"});
      return args;
    };
    // "bogus" used to turn logging off (spdlog maps unknown names to off), or was refused as an
    // unknown flag by five binaries.
    ExpectUsageError(command({"--log-level", "bogus"}), "--log-level",
                     "trace, debug, info, warn, error, off");
    ExpectUsageError(command({}), "bogus", "trace, debug, info, warn, error, off",
                     {"CONNEX_LOG_LEVEL=bogus"});
    ExpectUsageError(command({"--definitely-not-a-flag"}), "--definitely-not-a-flag");
  }
  // Google Benchmark's main takes its own flags; ours are parsed after.
  if (Built("bench_engine")) {
    ExpectUsageError({"bench_engine", "--log-level", "bogus"}, "--log-level",
                     "trace, debug, info, warn, error, off");
    ExpectUsageError({"bench_handover", "--runs", "0"}, "--runs");
    ExpectUsageError({"bench_handover", "--stages", "3", "--kill-stage", "3"}, "--kill-stage");
  }
  ExpectUsageError({"pp_test_node", "--stage", "3", "--stages", "3"}, "--stage");
  ExpectUsageError({"pp_test_node", "--engine", "gpt"}, "--engine");
  ExpectUsageError({"pp_test_node", "--model", "no/slashes"}, "--model");
  if (Built("bench_pp_memory")) {
    ExpectUsageError({"bench_pp_memory", "--requests", "5"}, "--requests");
  }
  if (Built("bench_directory")) {
    ExpectUsageError({"bench_directory", "--endpoints", "5000"}, "--endpoints");
    ExpectUsageError({"bench_directory", "--backend", "zookeeper"}, "--backend");
  }
  ExpectUsageError({"connex-directory", "--lease-ttl-ms", "0"}, "--lease-ttl-ms");
}

TEST_F(CliTest, EveryBinaryPrintsItsVersion) {
  std::set<std::string> binaries;
  for (const auto& command : HelpCommands()) binaries.insert(command[0]);
  for (const std::string& binary : binaries) {
    Outcome version = RunBinary({binary, "--version"});
    EXPECT_EQ(version.code, 0) << binary << "\n" << version.out;
    EXPECT_THAT(version.out, HasSubstr(binary + " " + CONNEX_VERSION)) << binary;
  }
}

TEST_F(CliTest, EveryFlagAndVariableOfEveryBinaryIsDocumented) {
  std::ifstream in(std::string(CONNEX_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in) << "docs/configuration.md";
  std::stringstream doc_text;
  doc_text << in.rdbuf();
  const std::string doc = doc_text.str();
  const std::regex flag("--[a-z][a-z0-9-]*"), variable("CONNEX_[A-Z0-9_]+");
  for (const auto& command : HelpCommands()) {
    Outcome help = RunBinary(command);
    ASSERT_EQ(help.code, 0) << Joined(command) << "\n" << help.out;
    // A sub-command's help shows only its own flags; --log-level belongs to the binary.
    if (command.size() == 2) {
      EXPECT_THAT(help.out, HasSubstr("--log-level")) << Joined(command);
    }
    for (const std::regex& pattern : {flag, variable}) {
      for (std::sregex_iterator it(help.out.begin(), help.out.end(), pattern), end; it != end;
           ++it) {
        const std::string name = it->str();
        if (name == "--help") continue;
        // A name is documented when it appears as `name` (a code span) in the file.
        EXPECT_TRUE(doc.find("`" + name + "`") != std::string::npos ||
                    doc.find("`" + name + " ") != std::string::npos)
            << name << " (" << Joined(command) << ") is not in docs/configuration.md";
      }
    }
  }
}

}  // namespace
}  // namespace connex::testing
