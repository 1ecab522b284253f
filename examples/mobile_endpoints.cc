// mobile_endpoints: the scenario of the reference README's "Core abstractions" section. A sender
// talks to two replicas of one logical group through the directory (never fixed ranks), survives
// one of them dying with a step in flight, sees it rejoin, follows a migration to a new address,
// and a scale-down. Prints six labelled lines with the real LIDs, payloads and epochs.
//
// As in the reference (`ElasticPeerSet(owner, transport, stage)`), the peer set takes the
// sender's transport: every endpoint has a TransferEngine, the replicas publish its address, and
// the peer set watches them through it, so a dead replica is evicted by the transport's
// peer-death event (its connection closed) rather than by a send timeout or its lease.
//
//   mobile_endpoints [--directory tcp://HOST:PORT] [--backend mem|tcp|shm|ucx|auto]
//   (default: an embedded directory, the in-process mem transport)
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "connex/base/cli.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "connex/elastic/channel.h"
#include "connex/elastic/peer_set.h"
#include "connex/transport/mem/mem_engine.h"
#include "connex/transport/transfer_engine.h"

namespace {

using connex::Lid;
using connex::StrCat;
using connex::directory::DirectoryClient;
using connex::elastic::ElasticPeerSet;
using connex::elastic::MessageInbox;

[[noreturn]] void Die(std::string_view what, const absl::Status& status) {
  std::cerr << "mobile_endpoints: " << what << ": " << status.message() << "\n";
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> value, std::string_view what) {
  if (!value.ok()) Die(what, value.status());
  return *std::move(value);
}

void Check(const absl::Status& status, std::string_view what) {
  if (!status.ok()) Die(what, status);
}

std::string List(const std::vector<Lid>& lids) {
  std::string out = "[";
  for (size_t i = 0; i < lids.size(); ++i) out += (i ? ", " : "") + lids[i].ToString();
  return out + "]";
}

// How every endpoint of the example creates its transport.
struct Transport {
  connex::transport::Backend backend = connex::transport::Backend::kMem;
  std::shared_ptr<connex::transport::mem::Fabric> fabric;  // mem only

  connex::transport::TransferEnginePtr Create(const Lid& lid) const {
    connex::transport::TransportOptions t;
    t.backend = backend;
    t.local_lid = lid;
    t.fabric = fabric;
    return Check(connex::transport::CreateTransferEngine(t), "transport " + lid.ToString());
  }
};

// One replica endpoint of group 1: its own directory client, transport and message inbox, as
// its own process would have them.
struct Replica {
  std::unique_ptr<DirectoryClient> client;
  connex::transport::TransferEnginePtr engine;
  std::unique_ptr<MessageInbox> inbox;
  uint64_t epoch = 0;
};

Replica StartReplica(const std::string& directory, const Transport& transport, const Lid& lid) {
  Replica r;
  connex::directory::DirectoryClientOptions options;
  options.directory = directory;
  options.rejoin_after_eviction = false;  // evicted means dead here: a new process comes instead
  r.client = Check(DirectoryClient::Connect(options), "connect " + lid.ToString());
  r.engine = transport.Create(lid);
  r.inbox = Check(MessageInbox::Start(), "inbox " + lid.ToString());
  std::vector<std::string> addresses = r.engine->LocalAddresses();
  addresses.insert(addresses.begin(), r.inbox->address());
  r.epoch = Check(r.client->Join(lid, addresses), "join " + lid.ToString());
  return r;
}

std::string Receive(MessageInbox& inbox) {
  std::optional<std::string> m = inbox.Receive(3000);
  if (!m) Die("receive", absl::DeadlineExceededError("no message within 3 s"));
  return *m;
}

}  // namespace

int main(int argc, char** argv) {
  connex::cli::App app{"Connex mobile endpoints: handover, rejoin, migration and scale-down"};
  std::string directory;
  std::string backend = "mem";
  app.add_option("--directory", directory, "use this directory instead of an embedded one")
      ->envname("CONNEX_DIRECTORY");
  app.add_option("--backend", backend, "transport of every endpoint: mem, tcp, shm, ucx or auto")
      ->envname("CONNEX_PP_BACKEND")
      ->check(connex::cli::IsMember({"mem", "tcp", "shm", "ucx", "auto"}));
  connex::AddLogLevelFlag(app, "warn");
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv)) return *code;

  std::unique_ptr<connex::directory::DirectoryServer> server;
  if (directory.empty()) {
    connex::directory::DirectoryServerOptions options;
    options.bind = "tcp://127.0.0.1:0";
    options.pub = "tcp://127.0.0.1:0";
    server = Check(connex::directory::DirectoryServer::Start(options), "directory");
    directory = server->bind_address();
  }

  Transport transport;
  transport.backend = Check(connex::transport::ParseBackend(backend), "backend");
  if (transport.backend == connex::transport::Backend::kMem) {
    transport.fabric = connex::transport::mem::Fabric::Create();
  }

  const Lid lid_a{"demo", 1, 0, 0};
  const Lid lid_b{"demo", 1, 0, 1};
  // Each replica joins under LID ("demo", group=1, shard=0, replica=r).
  Replica a = StartReplica(directory, transport, lid_a);
  Replica b = StartReplica(directory, transport, lid_b);

  // The sender resolves the group through the directory and watches it through its transport.
  connex::directory::DirectoryClientOptions owner_options;
  owner_options.directory = directory;
  auto owner = Check(DirectoryClient::Connect(owner_options), "connect owner");
  // The sender is a member of the model (stage 0, the owner): only members may report failures.
  auto owner_inbox = Check(MessageInbox::Start(), "owner inbox");
  Check(owner->Join(Lid{"demo", 0, 0, 0}, {owner_inbox->address()}), "join owner");
  connex::transport::TransferEnginePtr owner_transport = transport.Create(Lid{"demo", 0, 0, 0});
  ElasticPeerSet peers(*owner, owner_transport.get(),
                       {"demo", 1, /*own_replica=*/0, /*send_timeout_ms=*/200, "owner"});
  connex::Mutex mu;
  std::string failure;  // why replica 1 was evicted, from the change callback
  peers.OnChange([&](const connex::elastic::PeerChange& c) {
    if (c.kind != connex::elastic::PeerChange::Kind::kFailed || c.record.lid != lid_b) return;
    connex::MutexLock lock(&mu);
    if (failure.empty()) failure = c.reason;
  });
  Check(peers.Start(), "peer set");
  if (!peers.WaitReady(2, 5000)) Die("wait", absl::DeadlineExceededError("2 replicas not seen"));
  if (!connex::WaitUntil([&] { return peers.stats().watches >= 2; }, 5000)) {
    Die("watch", absl::DeadlineExceededError("the transport did not connect to both replicas"));
  }
  std::printf("replicas:   %s\n", List(peers.PeerLids()).c_str());

  for (const Lid& lid : peers.PeerLids()) Check(peers.Send(lid, "step"), "send step");
  std::string got_a = Receive(*a.inbox);
  std::string got_b = Receive(*b.inbox);
  std::printf("received:   %s %s\n", got_a.c_str(), got_b.c_str());

  // Replica 1's process dies (no LEAVE) while the next step is addressed to it: its inbox, its
  // transport (the connection the sender watches closes) and its heartbeats stop.
  b.inbox->Stop();
  auto start = std::chrono::steady_clock::now();  // the process exits now
  b.engine.reset();
  b.client.reset();
  absl::Status sent = peers.Send(lid_b, "step-42");
  if (sent.ok()) Die("handover", absl::InternalError("a dead replica acknowledged"));
  // Without a peer-death event (a backend without them) the sender evicts it itself; either way
  // it is evicted for every sender.
  if (peers.IsUsable(lid_b, b.epoch)) Check(peers.MarkFailed(lid_b), "mark failed");
  Lid next = Check(peers.Pick(&lid_b), "pick");
  Check(peers.Send(next, "step-42"), "resend");
  std::string handed = Receive(*a.inbox);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  start)
                .count();
  std::string why;
  if (connex::WaitUntil(
          [&] {
            connex::MutexLock lock(&mu);
            return !failure.empty();
          },
          3000)) {
    connex::MutexLock lock(&mu);
    why = failure;
  }
  std::printf("handover:   %s %s (%s evicted by %s, resent to %s in %lld ms)\n",
              List(peers.PeerLids()).c_str(), handed.c_str(), lid_b.ToString().c_str(), why.c_str(),
              next.ToString().c_str(), static_cast<long long>(ms));

  // Replica 1 comes back (scale up): a new process, the same LID, a new epoch.
  uint64_t old_epoch_b = b.epoch;
  if (!connex::WaitUntil([&] { return peers.pending_reports() == 0; }, 5000)) {
    Die("rejoin", absl::DeadlineExceededError("the eviction was not reported"));
  }
  b = StartReplica(directory, transport, lid_b);
  if (!peers.WaitReady(2, 5000)) Die("rejoin", absl::DeadlineExceededError("replica 1 not seen"));
  std::printf("rejoin:     %s (%s epoch %llu -> %llu)\n", List(peers.PeerLids()).c_str(),
              lid_b.ToString().c_str(), static_cast<unsigned long long>(old_epoch_b),
              static_cast<unsigned long long>(b.epoch));

  // Replica 0 migrates its inbox to a new address under the same LID.
  auto moved = Check(MessageInbox::Start(), "new inbox");
  std::vector<std::string> addresses = a.engine->LocalAddresses();
  addresses.insert(addresses.begin(), moved->address());
  uint64_t new_epoch = Check(a.client->Join(lid_a, addresses), "migrate");
  if (!connex::WaitUntil([&] { return peers.IsUsable(lid_a, new_epoch); }, 5000)) {
    Die("migrate", absl::DeadlineExceededError("migration not seen"));
  }
  a.inbox->Stop();  // the old address is gone
  Check(peers.Send(lid_a, "after-migrate"), "send after migrate");
  std::printf("migrate:    %s (%s epoch %llu -> %llu, now at %s)\n", Receive(*moved).c_str(),
              lid_a.ToString().c_str(), static_cast<unsigned long long>(a.epoch),
              static_cast<unsigned long long>(new_epoch), moved->address().c_str());

  // Replica 1 leaves gracefully (scale down): draining, never picked again.
  Check(b.client->Leave(lid_b), "leave");
  if (!connex::WaitUntil([&] { return peers.PeerLids().size() == 1; }, 5000)) {
    Die("scale-down", absl::DeadlineExceededError("LEFT not seen"));
  }
  std::printf("scale-down: %s (%s %s)\n", List(peers.PeerLids()).c_str(), lid_b.ToString().c_str(),
              std::string(connex::elastic::PeerStateName(peers.StateOf(lid_b, b.epoch))).c_str());
  Check(a.client->LeaveAll(), "leave");
  return 0;
}
