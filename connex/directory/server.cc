// DirectoryServer (server.h): its options from the environment, Start (sockets, CURVE, the state
// dir, the incarnation) and Stop, and its loop's core (internal/server_loop.h): the poll, the
// durable state written before any reply or event goes out, leases expired, ticks timed. The
// loop's requests are server_requests.cc, its per-connection bounds server_connections.cc, PUB
// server_publish.cc.
#include "connex/directory/server.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/internal/server_loop.h"
#include "connex/directory/protocol.h"
#include "connex/directory/registry.h"
#include "connex/directory/secret.h"
#include "connex/directory/state_file.h"

namespace connex::directory {
namespace {

uint64_t WallClockMillis() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// The process's resident memory (/proc/self/statm), 0 when it cannot be read.
int64_t ResidentBytes() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  long long size = 0, resident = 0;
  const bool read = std::fscanf(statm, "%lld %lld", &size, &resident) == 2;
  std::fclose(statm);
  return read ? resident * ::sysconf(_SC_PAGESIZE) : 0;
}

// The process's resident memory that its heap does not hold in use: free heap pages still
// resident, plus what is not heap at all (code, stacks, ZeroMQ's own mappings; about constant).
int64_t ResidentSlackBytes(const struct mallinfo2& heap) {
  return ResidentBytes() - static_cast<int64_t>(heap.uordblks + heap.hblkhd);
}

}  // namespace

absl::StatusOr<DirectoryServerOptions> DirectoryServerOptions::FromEnv() {
  DirectoryServerOptions o;
  o.bind = EnvString("CONNEX_DIRECTORY_BIND", o.bind);
  o.pub = EnvString("CONNEX_DIRECTORY_PUB", o.pub);
  CONNEX_ASSIGN_OR_RETURN(o.lease_ttl_ms,
                          EnvInt("CONNEX_LEASE_TTL_MS", o.lease_ttl_ms, 10, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(o.heartbeat_ms,
                          EnvInt("CONNEX_HEARTBEAT_MS", o.heartbeat_ms, 1, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.tick_ms, EnvInt("CONNEX_DIRECTORY_TICK_MS", o.tick_ms, 1, 60'000));
  CONNEX_ASSIGN_OR_RETURN(o.token, TokenFromEnv());
  o.state_dir = EnvString("CONNEX_DIRECTORY_STATE_DIR", "");
  int64_t limit = 0;
  CONNEX_ASSIGN_OR_RETURN(limit, EnvInt("CONNEX_DIRECTORY_MAX_RECORDS",
                                        static_cast<int64_t>(o.max_records), 1, 1 << 24));
  o.max_records = static_cast<size_t>(limit);
  CONNEX_ASSIGN_OR_RETURN(limit, EnvInt("CONNEX_DIRECTORY_MAX_RECORDS_PER_MODEL",
                                        static_cast<int64_t>(o.max_records_per_model), 1, 1 << 24));
  o.max_records_per_model = static_cast<size_t>(limit);
  CONNEX_ASSIGN_OR_RETURN(limit, EnvInt("CONNEX_DIRECTORY_MAX_RECORD_BYTES",
                                        static_cast<int64_t>(o.max_record_bytes), 256, 1 << 24));
  o.max_record_bytes = static_cast<size_t>(limit);
  CONNEX_ASSIGN_OR_RETURN(o.admin_token, AdminTokenFromEnv());
  CONNEX_ASSIGN_OR_RETURN(o.curve, CurveSettings::FromEnv());
  return o;
}

DirectoryServer::Loop::Loop(DirectoryServer* server, zmq::socket_t router, zmq::socket_t pub,
                            uint64_t first_epoch, std::unique_ptr<StateFile> state,
                            const std::optional<RegistryState>& saved)
    : server_(server),
      options_(server->options_),
      router_(std::move(router)),
      pub_(std::move(pub)),
      registry_(options_.clock, MakeRegistryOptions(options_, first_epoch)),
      state_(std::move(state)) {
  if (saved) {
    registry_.Restore(*saved);
    CONNEX_LOG_INFO("directory: restored {} records at revision {} from {} (next epoch {})",
                    registry_.size(), registry_.revision(), state_->path(), registry_.next_epoch());
  }
}

absl::Status DirectoryServer::Loop::Persist() {
  if (state_ == nullptr) return absl::OkStatus();
  if (saved_ && registry_.next_epoch() == saved_next_epoch_ &&
      registry_.revision() == saved_revision_) {
    return absl::OkStatus();  // heartbeats and idempotent JOINs change neither
  }
  const auto start = std::chrono::steady_clock::now();
  CONNEX_RETURN_IF_ERROR(state_->Save(registry_.Export()));
  const int64_t took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
  if (took_ms > server_->longest_state_write_ms_.load()) {
    server_->longest_state_write_ms_.store(took_ms);  // this loop is its only writer
  }
  if (took_ms >= kSlowStateWriteMs) {
    CONNEX_LOG_WARN(
        "directory: writing the state to {} took {} ms; no request was answered meanwhile (a "
        "slow disk: its fsync)",
        state_->path(), took_ms);
  }
  saved_ = true;
  saved_next_epoch_ = registry_.next_epoch();
  saved_revision_ = registry_.revision();
  return absl::OkStatus();
}

RegistryOptions DirectoryServer::Loop::MakeRegistryOptions(const DirectoryServerOptions& o,
                                                           uint64_t first_epoch) {
  RegistryOptions r;
  r.lease_ttl_ms = o.lease_ttl_ms;
  r.first_epoch = first_epoch;
  r.admin_token = o.admin_token;
  r.max_records = o.max_records;
  r.max_records_per_model = o.max_records_per_model;
  r.max_record_bytes = o.max_record_bytes;
  return r;
}

void DirectoryServer::Loop::Run() {
  int64_t next_tick = options_.clock->NowMs();
  std::vector<zmq::message_t> parts;
  while (!server_->stop_.load()) {
    int64_t now = options_.clock->NowMs();
    int64_t timeout = std::min<int64_t>(50, std::max<int64_t>(0, next_tick - now));
    std::optional<int64_t> expiry = registry_.MsUntilNextExpiry();
    if (expiry) timeout = std::min(timeout, *expiry);
    if (!snapshots_.empty()) timeout = 0;
    zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(timeout));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      CONNEX_LOG_ERROR("directory: poll failed: {}", e.what());
      return;
    }
    // Drain every pending request before looking at leases.
    for (int i = 0; i < 1024; ++i) {
      absl::StatusOr<bool> got = RecvMultipart(router_, &parts);
      if (!got.ok() || !*got) break;
      HandleMessage(parts);
    }
    registry_.ExpireLeases();
    if (absl::Status saved = Persist(); !saved.ok()) {
      // Replying now could hand out an epoch that a restart hands out again. Stop: a restart
      // resumes from the last state written, and clients retry what got no reply.
      CONNEX_LOG_FATAL("directory: {}; stopping", AsStd(saved.message()));
    }
    SendReplies();
    Publish();
    ServeSnapshots();
    now = options_.clock->NowMs();
    if (now >= next_tick) {
      PublishTick();
      next_tick = now + options_.tick_ms;
    }
    MaybeTrimHeap(now);
  }
}

// After a storm of requests (connections come and go, each with ZeroMQ's buffers), glibc keeps
// the freed memory resident: once a second, when more than kTrimFreeBytes of the heap are free
// and the resident memory the heap does not hold in use grew by kTrimGrowthBytes since the last
// trim, give it back (a storm of 500 connections kept 14 MB without it). Neither free bytes nor
// the process's growth alone tell: a trimmed heap counts its given-back chunks as free still (a
// storm that re-used them made them resident again without adding to the count), and a trim in
// the storm's peak, with the process at its largest, left the memory its connections freed as
// they closed resident for good (29 MB instead of 8 in a CI run). Resident-minus-in-use grows
// exactly when freed memory stays resident. malloc_trim gives back a thread arena's free memory
// only where it lies in the arena's bins, never its top: the connex-directory binary keeps one
// arena and fixes glibc's thresholds at start (apps/connex-directory/main.cc).
void DirectoryServer::Loop::MaybeTrimHeap(int64_t now) {
  if (!options_.trim_heap || now - last_trim_check_ms_ < kTrimCheckEveryMs) return;
  last_trim_check_ms_ = now;
  const struct mallinfo2 heap = mallinfo2();
  const int64_t slack = ResidentSlackBytes(heap);
  // The kernel may take idle pages back by itself (swap, DAMON): the baseline follows down.
  slack_after_trim_ = std::min(slack_after_trim_, slack);
  if (heap.fordblks <= kTrimFreeBytes || slack <= slack_after_trim_ + kTrimGrowthBytes) return;
  const int64_t resident = ResidentBytes();
  malloc_trim(0);
  const struct mallinfo2 after = mallinfo2();
  slack_after_trim_ = ResidentSlackBytes(after);
  const int64_t given_back = resident - ResidentBytes();
  const std::string line =
      StrCat("directory: freed heap given back to the system: resident ", Mib(resident), " -> ",
             Mib(resident - given_back), ", heap in use ",
             Mib(static_cast<int64_t>(after.uordblks + after.hblkhd)),
             ", free (given back or not) ", Mib(static_cast<int64_t>(after.fordblks)));
  // A trim that gives back much follows a storm, and is worth an operator's line.
  if (given_back >= kTrimLogBytes) {
    CONNEX_LOG_INFO("{}", line);
  } else {
    CONNEX_LOG_DEBUG("{}", line);
  }
}

DirectoryServer::DirectoryServer(DirectoryServerOptions options)
    : options_(std::move(options)), context_(1) {}

absl::StatusOr<std::unique_ptr<DirectoryServer>> DirectoryServer::Start(
    DirectoryServerOptions options) {
  if (options.lease_ttl_ms <= 0 || options.heartbeat_ms <= 0 || options.tick_ms <= 0) {
    return absl::InvalidArgumentError("directory: lease TTL, heartbeat and tick must be positive");
  }
  CONNEX_RETURN_IF_ERROR(ValidateLeaseSettings(options.lease_ttl_ms, options.heartbeat_ms));
  CONNEX_RETURN_IF_ERROR(
      Annotate(ValidateTableLimits(options.max_records, options.max_records_per_model,
                                   options.max_record_bytes),
               "directory"));
  for (const auto& [flag, endpoint] :
       {std::pair<std::string_view, const std::string&>{"--bind", options.bind},
        std::pair<std::string_view, const std::string&>{"--pub", options.pub}}) {
    absl::StatusOr<TcpEndpoint> parsed = ParseTcpEndpoint(endpoint);
    if (!parsed.ok()) return Annotate(parsed.status(), StrCat("directory: ", flag));
    CONNEX_RETURN_IF_ERROR(
        CheckListenExposure(StrCat("directory ", flag), parsed->host, options.curve.enabled()));
  }
  std::unique_ptr<DirectoryServer> server(new DirectoryServer(std::move(options)));
  if (server->options_.curve.enabled()) {
    CONNEX_ASSIGN_OR_RETURN(
        server->zap_,
        ZapHandler::Start(server->context_, server->options_.curve.authorized, "directory"));
  }
  zmq::socket_t router(server->context_, zmq::socket_type::router);
  zmq::socket_t pub(server->context_, zmq::socket_type::pub);
  // Size first: a request larger than any valid one (a record of max_record_bytes and its
  // envelope) is dropped by ZeroMQ, which disconnects its sender, before this loop reads or parses
  // a byte of it (100 connections of 1 MiB junk JOINs used to delay every HELLO by ~17 s).
  ConfigureZmqSocket(
      router,
      std::min<int64_t>(kMaxRequestBytes, static_cast<int64_t>(server->options_.max_record_bytes) +
                                              kRequestEnvelopeBytes));
  ConfigureZmqSocket(pub, kMaxRequestBytes);
  MakeCurveServer(router, server->options_.curve);
  MakeCurveServer(pub, server->options_.curve);
  router.set(zmq::sockopt::router_mandatory, 0);
  pub.set(zmq::sockopt::sndhwm, kPubHighWaterMark);
  absl::StatusOr<std::string> bound = BindZmq(router, server->options_.bind);
  if (!bound.ok()) return Annotate(bound.status(), "directory: --bind");
  server->bind_address_ = *bound;
  bound = BindZmq(pub, server->options_.pub);
  if (!bound.ok()) return Annotate(bound.status(), "directory: --pub");
  server->pub_address_ = *bound;
  // The incarnation only has to differ from the previous one's: the wall clock and a random
  // byte. Epochs must never repeat: with a state dir they continue from the saved counter (a
  // first start seeds it from the wall clock, so that epochs keep growing from an in-memory
  // past); in memory only, they are seeded from the wall clock and may repeat after a restart.
  uint64_t now_ms = WallClockMillis();
  std::random_device rd;
  server->incarnation_ = (now_ms << 8) ^ (rd() & 0xff);
  std::unique_ptr<StateFile> state;
  std::optional<RegistryState> saved;
  if (!server->options_.state_dir.empty()) {
    CONNEX_ASSIGN_OR_RETURN(state, StateFile::Open(server->options_.state_dir));
    CONNEX_ASSIGN_OR_RETURN(saved, state->Load());
  }
  // A saved counter wins over the clock; only a first start seeds from it.
  uint64_t first_epoch = saved ? 1 : now_ms;
  server->loop_ = std::make_unique<Loop>(server.get(), std::move(router), std::move(pub),
                                         first_epoch, std::move(state), saved);
  // The first write proves the state dir writable before anyone is served.
  absl::Status persisted = server->loop_->Persist();
  if (!persisted.ok()) {
    return absl::InvalidArgumentError(
        StrCat("directory: --state-dir '", server->options_.state_dir, "': ", persisted.message()));
  }
  server->thread_ = std::thread([s = server.get()] { s->loop_->Run(); });
  return server;
}

void DirectoryServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  loop_.reset();
  zap_.reset();
}

DirectoryServer::~DirectoryServer() { Stop(); }

}  // namespace connex::directory
