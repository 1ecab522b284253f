// The embedded directory's loop (internal/server_loop.h): PUB. Each event under its model's
// topic, and revision ticks — the directory-wide one, then one per model with a known latest
// event or a recent snapshot — by which a watcher finds a dropped event (docs/design/protocol.md).
#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>

#include "connex/base/codec.h"
#include "connex/base/logging.h"
#include "connex/directory/internal/server_loop.h"
#include "connex/directory/protocol.h"

namespace connex::directory {

void DirectoryServer::Loop::Publish() {
  for (const Event& e : registry_.TakeEvents()) {
    CONNEX_LOG_DEBUG("directory: {} {} {} epoch={}", e.revision, EventKindName(e.kind),
                     e.record.lid.ToString(), e.record.epoch);
    if (server_->drop_events_.load() > 0) {
      server_->drop_events_.fetch_sub(1);
      continue;
    }
    wire::MapBuilder body;
    EncodeEvent(e, server_->incarnation_, &body);
    std::string frame = wire::EncodeFrame(kEvent, body);
    std::string topic = EventTopic(e.record.lid.model);
    try {
      pub_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      pub_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& err) {
      CONNEX_LOG_WARN("directory: publishing event {} failed: {}", e.revision, err.what());
    }
  }
}

void DirectoryServer::Loop::PublishTick() {
  wire::MapBuilder body;
  body.Uint("incarnation", server_->incarnation_).Uint("revision", registry_.revision());
  SendTick(kTickTopic, wire::EncodeFrame(kTick, body));
  const int64_t now = options_.clock->NowMs();
  for (auto it = watched_.begin(); it != watched_.end();) {
    it = now - it->second > kWatchedForMs ? watched_.erase(it) : std::next(it);
  }
  auto tick = [&](const std::string& model, uint64_t revision) {
    wire::MapBuilder m;
    m.Uint("incarnation", server_->incarnation_)
        .Uint("revision", registry_.revision())
        .Str("model", model)
        .Uint("model_revision", revision);
    SendTick(EventTopic(model), wire::EncodeFrame(kTick, m));
  };
  const auto& known = registry_.model_revisions();
  for (const auto& [model, revision] : known) tick(model, revision);
  for (const auto& [model, at] : watched_) {
    if (known.count(model) == 0) tick(model, registry_.ModelRevision(model));
  }
}

void DirectoryServer::Loop::Watched(const std::string& model) {
  if (watched_.size() >= options_.max_records && watched_.count(model) == 0) {
    auto oldest =
        std::min_element(watched_.begin(), watched_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    watched_.erase(oldest);
  }
  watched_[model] = options_.clock->NowMs();
}

void DirectoryServer::Loop::SendTick(std::string_view topic, const std::string& frame) {
  try {
    pub_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    pub_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& err) {
    CONNEX_LOG_WARN("directory: publishing tick failed: {}", err.what());
  }
}

}  // namespace connex::directory
