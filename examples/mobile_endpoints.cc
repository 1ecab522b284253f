// mobile_endpoints: the scenario of the reference README's "Core abstractions" section. A sender
// talks to two replicas of one logical group through the directory (never fixed ranks), survives
// one of them dying with a step in flight, sees it rejoin, follows a migration to a new address,
// and a scale-down. Prints six labelled lines with the real LIDs, payloads and epochs.
//
//   mobile_endpoints [--directory tcp://HOST:PORT]   (default: an embedded directory)
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "connex/elastic/channel.h"
#include "connex/elastic/peer_set.h"

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

// One replica endpoint of group 1: its own directory client (as its own process would have) and
// its message inbox.
struct Replica {
  std::unique_ptr<DirectoryClient> client;
  std::unique_ptr<MessageInbox> inbox;
  uint64_t epoch = 0;
};

Replica StartReplica(const std::string& directory, const Lid& lid) {
  Replica r;
  connex::directory::DirectoryClientOptions options;
  options.directory = directory;
  r.client = Check(DirectoryClient::Connect(options), "connect " + lid.ToString());
  r.inbox = Check(MessageInbox::Start(), "inbox " + lid.ToString());
  r.epoch = Check(r.client->Join(lid, {r.inbox->address()}), "join " + lid.ToString());
  return r;
}

std::string Receive(MessageInbox& inbox) {
  std::optional<std::string> m = inbox.Receive(3000);
  if (!m) Die("receive", absl::DeadlineExceededError("no message within 3 s"));
  return *m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Connex mobile endpoints: handover, rejoin, migration and scale-down"};
  std::string directory;
  app.add_option("--directory", directory, "use this directory instead of an embedded one")
      ->envname("CONNEX_DIRECTORY");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  connex::Log().set_level(spdlog::level::warn);

  std::unique_ptr<connex::directory::DirectoryServer> server;
  if (directory.empty()) {
    connex::directory::DirectoryServerOptions options;
    options.bind = "tcp://127.0.0.1:0";
    options.pub = "tcp://127.0.0.1:0";
    server = Check(connex::directory::DirectoryServer::Start(options), "directory");
    directory = server->bind_address();
  }

  const Lid lid_a{"demo", 1, 0, 0};
  const Lid lid_b{"demo", 1, 0, 1};
  // Each replica joins under LID ("demo", group=1, shard=0, replica=r).
  Replica a = StartReplica(directory, lid_a);
  Replica b = StartReplica(directory, lid_b);

  // The sender resolves the group through the directory.
  connex::directory::DirectoryClientOptions owner_options;
  owner_options.directory = directory;
  auto owner = Check(DirectoryClient::Connect(owner_options), "connect owner");
  // The sender is a member of the model (stage 0, the owner): only members may report failures.
  auto owner_inbox = Check(MessageInbox::Start(), "owner inbox");
  Check(owner->Join(Lid{"demo", 0, 0, 0}, {owner_inbox->address()}), "join owner");
  ElasticPeerSet peers(*owner, {"demo", 1, /*own_replica=*/0, /*send_timeout_ms=*/200, "owner"});
  Check(peers.Start(), "peer set");
  if (!peers.WaitReady(2, 5000)) Die("wait", absl::DeadlineExceededError("2 replicas not seen"));
  std::printf("replicas:   %s\n", List(peers.PeerLids()).c_str());

  for (const Lid& lid : peers.PeerLids()) Check(peers.Send(lid, "step"), "send step");
  std::string got_a = Receive(*a.inbox);
  std::string got_b = Receive(*b.inbox);
  std::printf("received:   %s %s\n", got_a.c_str(), got_b.c_str());

  // Replica 1 dies (no LEAVE) while the next step is addressed to it.
  b.inbox->Stop();
  b.client.reset();
  auto start = std::chrono::steady_clock::now();
  absl::Status sent = peers.Send(lid_b, "step-42");
  if (sent.ok()) Die("handover", absl::InternalError("a dead replica acknowledged"));
  Check(peers.MarkFailed(lid_b), "mark failed");  // evicted for every sender
  Lid next = Check(peers.Pick(), "pick");
  Check(peers.Send(next, "step-42"), "resend");
  std::string handed = Receive(*a.inbox);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  start)
                .count();
  std::printf("handover:   %s %s (%s unreachable, resent to %s in %lld ms)\n",
              List(peers.PeerLids()).c_str(), handed.c_str(), lid_b.ToString().c_str(),
              next.ToString().c_str(), static_cast<long long>(ms));

  // Replica 1 comes back (scale up): a new process, the same LID, a new epoch.
  uint64_t old_epoch_b = b.epoch;
  b = StartReplica(directory, lid_b);
  if (!peers.WaitReady(2, 5000)) Die("rejoin", absl::DeadlineExceededError("replica 1 not seen"));
  std::printf("rejoin:     %s (%s epoch %llu -> %llu)\n", List(peers.PeerLids()).c_str(),
              lid_b.ToString().c_str(), static_cast<unsigned long long>(old_epoch_b),
              static_cast<unsigned long long>(b.epoch));

  // Replica 0 migrates to a new address under the same LID.
  auto moved = Check(MessageInbox::Start(), "new inbox");
  uint64_t new_epoch = Check(a.client->Join(lid_a, {moved->address()}), "migrate");
  bool followed = false;
  for (int i = 0; i < 500 && !followed; ++i) {
    for (const auto& r : peers.Peers()) followed |= r.lid == lid_a && r.epoch == new_epoch;
    if (!followed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!followed) Die("migrate", absl::DeadlineExceededError("migration not seen"));
  a.inbox->Stop();  // the old address is gone
  Check(peers.Send(lid_a, "after-migrate"), "send after migrate");
  std::printf("migrate:    %s (%s epoch %llu -> %llu, now at %s)\n", Receive(*moved).c_str(),
              lid_a.ToString().c_str(), static_cast<unsigned long long>(a.epoch),
              static_cast<unsigned long long>(new_epoch), moved->address().c_str());

  // Replica 1 leaves gracefully (scale down).
  Check(b.client->Leave(lid_b), "leave");
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = peers.PeerLids().size() == 1;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!gone) Die("scale-down", absl::DeadlineExceededError("LEFT not seen"));
  std::printf("scale-down: %s\n", List(peers.PeerLids()).c_str());
  Check(a.client->LeaveAll(), "leave");
  return 0;
}
