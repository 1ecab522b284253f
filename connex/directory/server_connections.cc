// The embedded directory's loop (internal/server_loop.h): what it keeps per connection. A
// connection that sends too many refused requests is not read for a while; replies are handed to
// ZeroMQ without a copy and counted as unread until libzmq is done with them, per connection and
// in total, and a SNAPSHOT is refused while its client (or every client) leaves too much unread;
// snapshots are served within a time budget per turn, from a cache per revision and scope.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/codec.h"
#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/internal/server_loop.h"
#include "connex/directory/protocol.h"

namespace connex::directory {
namespace {

struct ReplyData {
  std::string bytes;
  std::shared_ptr<Unread> unread;
  std::shared_ptr<std::atomic<int64_t>> connection;
  // Set (release) by the loop before libzmq takes the message, read (acquire) by FreeReply: the
  // hand-over inside libzmq is invisible to ThreadSanitizer, this edge is not.
  std::atomic<bool> handed_over{false};
};

// Runs on whichever thread libzmq releases the message on.
void FreeReply(void* /*data*/, void* hint) {
  std::unique_ptr<ReplyData> reply(static_cast<ReplyData*>(hint));
  (void)reply->handed_over.load(std::memory_order_acquire);
  const auto n = static_cast<int64_t>(reply->bytes.size());
  reply->unread->total.fetch_sub(n, std::memory_order_relaxed);
  reply->connection->fetch_sub(n, std::memory_order_relaxed);
}

}  // namespace

std::string Mib(int64_t bytes) {
  return bytes >= (1 << 20) ? StrCat(bytes >> 20, " MiB") : StrCat(bytes >> 10, " KiB");
}

void DirectoryServer::Loop::HandleMessage(std::vector<zmq::message_t>& parts) {
  if (parts.empty()) return;
  const int64_t now = options_.clock->NowMs();
  std::string connection(AsView(parts[0]));
  auto budget = junk_by_connection_.find(connection);
  if (budget != junk_by_connection_.end() && budget->second.cooldown_until_ms > now) {
    server_->requests_dropped_.fetch_add(1);
    return;
  }
  const uint64_t rejected_before = server_->requests_rejected_.load();
  token_refused_ = false;
  HandleRequest(parts);
  if (server_->requests_rejected_.load() == rejected_before && !token_refused_) return;
  if (junk_by_connection_.size() >= kMaxJunkConnections) {
    std::erase_if(junk_by_connection_, [now](const auto& e) {
      return e.second.cooldown_until_ms <= now && now - e.second.window_ms >= 1000;
    });
  }
  if (junk_by_connection_.size() >= kMaxJunkConnections) return;  // under a storm: unbudgeted
  JunkBudget& b = junk_by_connection_[connection];
  if (now - b.window_ms >= 1000) {
    b.window_ms = now;
    b.refused = 0;
  }
  if (++b.refused > kJunkPerSecond) {
    b.cooldown_until_ms = now + kJunkCooldownMs;
    b.refused = 0;
    CONNEX_LOG_WARN(
        "directory: a connection sent more than {} refused requests in a second; its requests "
        "are dropped unread for {} ms",
        kJunkPerSecond, kJunkCooldownMs);
  }
}

void DirectoryServer::Loop::SendReplies() {
  for (Reply& r : replies_) Send(r.envelope, std::move(r.frame));
  replies_.clear();
}

std::shared_ptr<std::atomic<int64_t>> DirectoryServer::Loop::UnreadOf(
    const std::vector<zmq::message_t>& envelope) {
  std::string identity = envelope.empty() ? std::string() : std::string(AsView(envelope[0]));
  if (unread_by_connection_.size() >= prune_unread_at_) {
    // Connections with nothing unread are forgotten; the table is as large as those with a
    // backlog, which the total limit bounds.
    std::erase_if(unread_by_connection_,
                  [](const auto& entry) { return entry.second->load() <= 0; });
    prune_unread_at_ = std::max<size_t>(1024, 2 * unread_by_connection_.size());
  }
  auto& counter = unread_by_connection_[identity];
  if (counter == nullptr) counter = std::make_shared<std::atomic<int64_t>>(0);
  return counter;
}

void DirectoryServer::Loop::Send(std::vector<zmq::message_t>& envelope, std::string frame) {
  auto data = std::make_unique<ReplyData>();
  data->bytes = std::move(frame);
  data->unread = unread_;
  data->connection = UnreadOf(envelope);
  const auto n = static_cast<int64_t>(data->bytes.size());
  unread_->total.fetch_add(n, std::memory_order_relaxed);
  data->connection->fetch_add(n, std::memory_order_relaxed);
  char* bytes = data->bytes.data();
  const size_t size = data->bytes.size();
  data->handed_over.store(true, std::memory_order_release);
  // From here libzmq owns `data`: FreeReply runs when the message is sent or dropped.
  zmq::message_t message(bytes, size, &FreeReply, data.release());
  try {
    for (zmq::message_t& e : envelope)
      router_.send(e, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router_.send(message, zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    CONNEX_LOG_DEBUG("directory: reply dropped: {}", e.what());
  }
}

void DirectoryServer::Loop::ServeSnapshots() {
  const int64_t start = options_.clock->NowMs();
  while (!snapshots_.empty()) {
    PendingSnapshot p = std::move(snapshots_.front());
    snapshots_.pop_front();
    std::shared_ptr<std::atomic<int64_t>> connection = UnreadOf(p.envelope);
    std::string reply;
    if (const int64_t mine = connection->load(); mine > kMaxUnreadBytesPerConnection) {
      ++server_->snapshots_refused_;
      reply = EncodeError(
          p.id, absl::ResourceExhaustedError(
                    StrCat("directory: SNAPSHOT refused: ", Mib(mine),
                           " of earlier replies to this connection are unread (the limit is ",
                           Mib(kMaxUnreadBytesPerConnection), "); read them, then ask again")));
    } else if (const int64_t all = unread_->total.load(); all > kMaxUnreadBytes) {
      ++server_->snapshots_refused_;
      reply = EncodeError(p.id, absl::UnavailableError(
                                    StrCat("directory: SNAPSHOT refused for now: ", Mib(all),
                                           " of replies are unread by their clients (the limit is ",
                                           Mib(kMaxUnreadBytes), "); retry")));
    } else {
      if (p.model) Watched(*p.model);
      wire::MapBuilder out;
      out.Uint("id", p.id).Entries(EncodedSnapshot(p.model, p.group));
      reply = wire::EncodeFrame(kOk, out);
      server_->requests_served_.fetch_add(1);
    }
    Send(p.envelope, std::move(reply));
    if (options_.clock->NowMs() - start >= kSnapshotBudgetMs) break;
  }
}

const wire::MapBuilder& DirectoryServer::Loop::EncodedSnapshot(
    const std::optional<std::string>& model, std::optional<uint32_t> group) {
  const int64_t now = options_.clock->NowMs();
  if (cache_revision_ != registry_.revision() || now - cache_at_ms_ > kSnapshotCacheMs ||
      cache_.size() >= kMaxCachedSnapshots) {
    cache_.clear();
    cache_revision_ = registry_.revision();
    cache_at_ms_ = now;
  }
  std::unique_ptr<wire::MapBuilder>& entry = cache_[{model, group}];
  if (entry == nullptr) {
    entry = std::make_unique<wire::MapBuilder>();
    EncodeSnapshot(registry_.Snap(server_->incarnation_, model, group), entry.get());
  }
  return *entry;
}

}  // namespace connex::directory
