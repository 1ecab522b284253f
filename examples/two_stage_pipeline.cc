// two_stage_pipeline: directory discovery plus a tensor transfer between two stage processes over
// a real backend. The parent starts a directory and stage 0; it spawns itself as stage 1; stage 0
// finds stage 1 through the directory (never a fixed address), and each step's tensor is pulled
// by stage 1 with one one-sided read from stage 0's send ring. Both sides print what crossed
// (shape, checksum); the parent exits 0 when they agree.
//
//   two_stage_pipeline [--backend tcp|shm|ucx] [--tokens N] [--hidden D]
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <iostream>
#include <string>

#include "connex/base/cli.h"
#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "connex/pp/engine.h"
#include "connex/pp/node.h"

extern char** environ;

namespace {

using connex::pp::DType;
using connex::pp::Tensor;
using connex::pp::TensorDict;

// FNV-1a over the tensor's bytes.
uint64_t Checksum(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : t.data) h = (h ^ b) * 1099511628211ull;
  return h;
}

std::string Describe(const Tensor& t) {
  return connex::StrCat(connex::pp::DTypeName(t.dtype), " ", connex::pp::ShapeString(t.shape),
                        " checksum=", fmt::format("{:016x}", Checksum(t)));
}

// Stage 0 turns each token into a row of `hidden` floats; stage 1 reports what it received and
// returns, as each request's next token, 31 bits of the checksum of what it received, which
// stage 0 compares with what it sent. Stateless: it holds every request.
class ExampleEngine : public connex::pp::Engine {
 public:
  ExampleEngine(uint32_t stage, int hidden) : stage_(stage), hidden_(hidden) {}

  absl::StatusOr<TensorDict> ExecuteStep(const TensorDict& in) override {
    auto batch = connex::pp::GetBatch(in);
    if (!batch.ok()) return batch.status();
    TensorDict out;
    connex::pp::SetBatch(out, batch->request_ids, batch->start_positions, batch->num_tokens);
    if (stage_ == 0) {
      auto tokens = in.Get(connex::pp::kTokens, DType::kI32, 1);
      if (!tokens.ok()) return tokens.status();
      const int64_t n = (*tokens)->shape[0];
      std::vector<float> h(static_cast<size_t>(n * hidden_));
      for (int64_t i = 0; i < n; ++i) {
        for (int j = 0; j < hidden_; ++j) {
          h[static_cast<size_t>(i * hidden_ + j)] =
              static_cast<float>((*tokens)->values<int32_t>()[i]) * 0.5f + static_cast<float>(j);
        }
      }
      Tensor t = Tensor::Of<float>({n, hidden_}, h);
      sent_checksum_ = Checksum(t);
      std::printf("stage 0 sent:     hidden %s\n", Describe(t).c_str());
      std::fflush(stdout);
      out.Set("hidden", std::move(t));
    } else {
      auto hidden = in.Get("hidden", DType::kF32, 2);
      if (!hidden.ok()) return hidden.status();
      std::printf("stage 1 received: hidden %s\n", Describe(**hidden).c_str());
      std::fflush(stdout);
      std::vector<int32_t> next(batch->request_ids.size(),
                                static_cast<int32_t>(Checksum(**hidden) & 0x7fffffff));
      out.Set(connex::pp::kNextTokens,
              Tensor::Of<int32_t>({static_cast<int64_t>(next.size())}, next));
    }
    return out;
  }
  std::vector<uint64_t> MissingRequests(const TensorDict&) const override { return {}; }
  bool HoldsRequest(uint64_t) const override { return true; }
  void Release(uint64_t) override {}
  size_t NumHeldRequests() const override { return 0; }  // it keeps no state between steps
  uint64_t sent_checksum() const { return sent_checksum_; }

 private:
  uint64_t sent_checksum_ = 0;
  uint32_t stage_;
  int hidden_;
};

[[noreturn]] void Die(std::string_view what, const absl::Status& s) {
  std::cerr << "two_stage_pipeline: " << what << ": " << s.message() << "\n";
  std::exit(1);
}

std::unique_ptr<connex::pp::StageNode> StartStage(uint32_t stage, const std::string& backend,
                                                  int hidden,
                                                  connex::directory::DirectoryClient& client,
                                                  ExampleEngine& engine) {
  connex::Lid lid{"example", stage, 0, 0};
  auto topts = connex::transport::TransportOptions::FromEnv(lid);
  if (!topts.ok()) Die("transport options", topts.status());
  auto parsed = connex::transport::ParseBackend(backend);
  if (!parsed.ok()) Die("--backend", parsed.status());
  topts->backend = *parsed;
  auto transfer = connex::transport::CreateTransferEngine(*topts);
  if (!transfer.ok()) Die("transport", transfer.status());
  auto signals = connex::pp::CreateZmqSignalTransport();
  if (!signals.ok()) Die("signals", signals.status());
  connex::pp::StageNodeOptions o;
  o.model = "example";
  o.stage = stage;
  o.stages = 2;
  o.slot_bytes =
      std::max<int64_t>(1 << 20, (static_cast<int64_t>(hidden) * 4 * 4096 + 4096) / 64 * 64);
  auto node =
      connex::pp::StageNode::Start(o, engine, *std::move(transfer), *std::move(signals), client);
  if (!node.ok()) Die("stage", node.status());
  return *std::move(node);
}

}  // namespace

int main(int argc, char** argv) {
  connex::cli::App app{
      "two_stage_pipeline: directory discovery and a tensor transfer between processes"};
  std::string backend = "tcp";
  std::string role = "driver";
  std::string directory;
  int tokens = 8;
  int hidden = 1024;
  app.add_option("--backend", backend, "tcp, shm or ucx")
      ->envname("CONNEX_PP_BACKEND")
      ->capture_default_str();
  app.add_option("--tokens", tokens, "prompt length (rows of the tensor)")
      ->check(connex::cli::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--hidden", hidden, "columns of the tensor")
      ->check(connex::cli::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--role", role)->group("");  // internal: the spawned stage 1
  app.add_option("--directory", directory)->group("");
  connex::AddLogLevelFlag(app, "warn");
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv)) return *code;
  if (auto parsed = connex::transport::ParseBackend(backend); !parsed.ok()) {
    std::cerr << "two_stage_pipeline: --backend: " << parsed.status().message() << "\n";
    return 2;
  }

  if (role == "stage1") {
    connex::directory::DirectoryClientOptions d;
    d.directory = directory;
    auto client = connex::directory::DirectoryClient::Connect(d);
    if (!client.ok()) Die("directory", client.status());
    ExampleEngine engine(1, hidden);
    auto node = StartStage(1, backend, hidden, **client, engine);
    char buf[16];
    ssize_t n = read(0, buf, sizeof(buf));  // runs until the driver closes our stdin
    (void)n;
    node->Stop(/*leave=*/true, 2000);
    return 0;
  }

  connex::directory::DirectoryServerOptions server_options;
  server_options.bind = "tcp://127.0.0.1:0";
  server_options.pub = "tcp://127.0.0.1:0";
  auto server = connex::directory::DirectoryServer::Start(server_options);
  if (!server.ok()) Die("directory", server.status());
  std::printf("directory at %s\n", (*server)->bind_address().c_str());

  // Stage 1 is its own process.
  int to_child[2];
  if (pipe(to_child) != 0) Die("pipe", absl::InternalError(std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  std::string self = "/proc/self/exe";
  std::vector<std::string> args = {
      argv[0],     "--role", "stage1",   "--directory",         (*server)->bind_address(),
      "--backend", backend,  "--hidden", std::to_string(hidden)};
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t child = -1;
  int spawned = posix_spawn(&child, self.c_str(), &actions, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) Die("spawn", absl::InternalError("cannot start stage 1"));
  close(to_child[0]);

  connex::directory::DirectoryClientOptions d;
  d.directory = (*server)->bind_address();
  auto client = connex::directory::DirectoryClient::Connect(d);
  if (!client.ok()) Die("directory", client.status());
  ExampleEngine engine(0, hidden);
  auto node = StartStage(0, backend, hidden, **client, engine);
  // Discovery: stage 1 is found through the directory.
  if (!(*client)->AwaitView(
          "example", [](const auto& v) { return v.size() == 2; }, 15000)) {
    Die("discovery", absl::DeadlineExceededError("stage 1 did not join within 15 s"));
  }
  for (const auto& r : (*client)->View("example", 1)) {
    std::printf("discovered %s epoch=%llu at", r.lid.ToString().c_str(),
                static_cast<unsigned long long>(r.epoch));
    for (const auto& a : r.addresses) std::printf(" %s", a.c_str());
    std::printf("\n");
  }
  std::fflush(stdout);
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (int i = 0; i < tokens; ++i) prompt[static_cast<size_t>(i)] = i * 3 + 1;
  std::promise<absl::StatusOr<std::vector<int32_t>>> result;
  absl::Status submitted =
      node->Submit(1, prompt, 1, [&result](uint64_t, auto r) { result.set_value(std::move(r)); });
  if (!submitted.ok()) Die("submit", submitted);
  auto future = result.get_future();
  if (future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    Die("step", absl::DeadlineExceededError("no result within 30 s"));
  }
  absl::StatusOr<std::vector<int32_t>> got = future.get();
  if (!got.ok()) Die("step", got.status());
  const int32_t want = static_cast<int32_t>(engine.sent_checksum() & 0x7fffffff);
  bool ok = got->size() == 1 && (*got)[0] == want;
  std::printf("result: stage 1's checksum %s stage 0's over backend %s\n",
              ok ? "matches" : "DOES NOT MATCH", backend.c_str());
  close(to_child[1]);
  int status = 0;
  waitpid(child, &status, 0);
  node->Stop(/*leave=*/true, 1000);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
