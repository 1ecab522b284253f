#include "connex/transport/auto_engine.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/internal/event_hub.h"

namespace connex::transport {
namespace {

class AutoEngine final : public TransferEngine {
 public:
  explicit AutoEngine(std::vector<TransferEnginePtr> engines) : engines_(std::move(engines)) {
    for (auto& e : engines_) {
      subscriptions_.push_back(
          e->SubscribePeerEvents([this](const PeerEvent& ev) { hub_.Publish(ev); }));
    }
  }
  ~AutoEngine() override {
    for (size_t i = 0; i < engines_.size(); ++i) {
      engines_[i]->UnsubscribePeerEvents(subscriptions_[i]);
    }
  }

  absl::Status RegisterMemory(void* addr, size_t length) override {
    for (size_t i = 0; i < engines_.size(); ++i) {
      absl::Status s = engines_[i]->RegisterMemory(addr, length);
      if (!s.ok()) {
        for (size_t j = 0; j < i; ++j) engines_[j]->UnregisterMemory(addr).IgnoreError();
        return s;
      }
    }
    return absl::OkStatus();
  }

  absl::Status UnregisterMemory(void* addr) override {
    // The first engine rejects managed buffers with a clear error; check it first.
    CONNEX_RETURN_IF_ERROR(engines_[0]->UnregisterMemory(addr));
    for (size_t i = 1; i < engines_.size(); ++i) engines_[i]->UnregisterMemory(addr).IgnoreError();
    return absl::OkStatus();
  }

  absl::Status TransferSyncRead(const PeerRef& peer, void* local, uint64_t remote_addr,
                                size_t length) override {
    CONNEX_ASSIGN_OR_RETURN(TransferEngine * engine, Pick(peer));
    return engine->TransferSyncRead(peer, local, remote_addr, length);
  }

  absl::StatusOr<void*> AllocateManagedBuffer(size_t length) override {
    CONNEX_ASSIGN_OR_RETURN(void* buffer, engines_[0]->AllocateManagedBuffer(length));
    for (size_t i = 1; i < engines_.size(); ++i) {
      absl::Status s = engines_[i]->RegisterMemory(buffer, length);
      if (!s.ok()) {
        for (size_t j = 1; j < i; ++j) engines_[j]->UnregisterMemory(buffer).IgnoreError();
        engines_[0]->FreeManagedBuffer(buffer).IgnoreError();
        return s;
      }
    }
    return buffer;
  }

  absl::Status FreeManagedBuffer(void* buffer) override {
    // Validate first: only the first engine knows it as managed.
    CONNEX_RETURN_IF_ERROR(engines_[0]->CopyToManagedBuffer(buffer, buffer, 0));
    for (size_t i = 1; i < engines_.size(); ++i)
      engines_[i]->UnregisterMemory(buffer).IgnoreError();
    return engines_[0]->FreeManagedBuffer(buffer);
  }

  absl::Status CopyToManagedBuffer(void* dst, const void* src, size_t length) override {
    return engines_[0]->CopyToManagedBuffer(dst, src, length);
  }
  absl::Status CopyFromManagedBuffer(void* dst, const void* src, size_t length) override {
    return engines_[0]->CopyFromManagedBuffer(dst, src, length);
  }

  std::vector<std::string> LocalAddresses() const override {
    std::vector<std::string> all;
    for (const auto& e : engines_) {
      for (std::string& a : e->LocalAddresses()) all.push_back(std::move(a));
    }
    return all;
  }

  Capabilities GetCapabilities() const override {
    Capabilities c;
    c.backend = "auto";
    c.peer_events = true;
    c.hung_peer_detection = true;
    c.cross_process = true;
    for (const auto& e : engines_) {
      Capabilities sub = e->GetCapabilities();
      c.peer_events &= sub.peer_events;
      c.hung_peer_detection &= sub.hung_peer_detection;
    }
    return c;
  }

  absl::Status Connect(const PeerRef& peer) override { return Pick(peer).status(); }

  uint64_t SubscribePeerEvents(PeerEventCallback cb) override {
    return hub_.Subscribe(std::move(cb));
  }
  void UnsubscribePeerEvents(uint64_t id) override { hub_.Unsubscribe(id); }

 private:
  struct Choice {
    std::vector<std::string> addresses;
    TransferEngine* engine = nullptr;
  };

  // The engine for `peer`: cached per LID while its addresses stay the same; otherwise the
  // first engine in order of preference whose scheme the peer publishes and that connects.
  absl::StatusOr<TransferEngine*> Pick(const PeerRef& peer) {
    {
      MutexLock lock(&mu_);
      auto it = choices_.find(peer.lid);
      if (it != choices_.end() && it->second.addresses == peer.addresses) {
        return it->second.engine;
      }
    }
    absl::Status last = absl::UnavailableError(
        StrCat("auto: peer ", peer.lid.ToString(), " publishes no address usable from here"));
    for (auto& e : engines_) {
      std::string prefix = StrCat(e->GetCapabilities().backend, "://");
      bool offered = false;
      for (const std::string& a : peer.addresses) offered |= a.rfind(prefix, 0) == 0;
      if (!offered) continue;
      absl::Status s = e->Connect(peer);
      if (s.ok()) {
        MutexLock lock(&mu_);
        auto [it, fresh] = choices_.insert_or_assign(peer.lid, Choice{peer.addresses, e.get()});
        (void)it;
        if (fresh) {
          CONNEX_LOG_INFO("transport auto: {} via {}", peer.lid.ToString(),
                          e->GetCapabilities().backend);
        }
        return e.get();
      }
      if (s.code() == absl::StatusCode::kFailedPrecondition) return s;
      last = s;
    }
    return last;
  }

  std::vector<TransferEnginePtr> engines_;
  std::vector<uint64_t> subscriptions_;
  internal::EventHub hub_;
  Mutex mu_;
  absl::flat_hash_map<Lid, Choice> choices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<TransferEnginePtr> CreateAutoEngine(std::vector<TransferEnginePtr> engines) {
  if (engines.empty()) return absl::UnavailableError("auto: no transport backend could start");
  return std::make_unique<AutoEngine>(std::move(engines));
}

}  // namespace connex::transport
