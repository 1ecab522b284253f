// FaultInjectingTransferEngine: forwards every call to a real TransferEngine and fails or
// tampers with the ones a test chooses (LevelDB's FaultInjectionTestEnv, for the data plane):
// managed-buffer allocations that fail, a hook that runs right after a read completed and may
// change the bytes that arrived or the memory read (a read that overlapped a slot's reuse), and
// reads of a peer held as a silent peer holds them.
// Thread-safe.
#ifndef CONNEX_PP_TESTING_FAULT_ENGINE_H_
#define CONNEX_PP_TESTING_FAULT_ENGINE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "connex/base/lid.h"
#include "connex/base/mutex.h"
#include "connex/transport/transfer_engine.h"

namespace connex::pp::testing {

class FaultInjectingTransferEngine : public transport::TransferEngine {
 public:
  explicit FaultInjectingTransferEngine(transport::TransferEnginePtr inner)
      : inner_(std::move(inner)) {}

  // Allocations of at least `bytes` fail with ResourceExhausted.
  void FailAllocationsOf(size_t bytes) { fail_alloc_bytes_.store(bytes); }
  // Runs after each successful read (local buffer, remote address, length); the next reads
  // are affected only while it is set.
  using AfterRead = std::function<void(void* local, uint64_t remote, size_t length)>;
  void SetAfterRead(AfterRead hook) {
    connex::MutexLock lock(&mu_);
    after_read_ = hook ? std::make_shared<AfterRead>(std::move(hook)) : nullptr;
  }

  // Reads from `lid` wait until ReleaseHeldReads (a peer that stopped answering, until its
  // transport gave up on it), then fail with Unavailable as such a read does.
  void HoldReadsFrom(const Lid& lid) {
    connex::MutexLock lock(&mu_);
    held_lid_ = lid;
    holding_ = true;
  }
  void ReleaseHeldReads() {
    connex::MutexLock lock(&mu_);
    holding_ = false;
  }
  // Reads waiting in HoldReadsFrom now.
  int held_reads() {
    connex::MutexLock lock(&mu_);
    return held_reads_;
  }

  absl::Status RegisterMemory(void* addr, size_t length) override {
    return inner_->RegisterMemory(addr, length);
  }
  absl::Status UnregisterMemory(void* addr) override { return inner_->UnregisterMemory(addr); }
  absl::Status TransferSyncRead(const transport::PeerRef& peer, void* local, uint64_t remote,
                                size_t length) override {
    {
      connex::MutexLock lock(&mu_);
      if (holding_ && peer.lid == held_lid_) {
        ++held_reads_;
        auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !holding_; };
        mu_.Await(absl::Condition(&released));
        --held_reads_;
        return absl::UnavailableError("fault injection: " + peer.lid.ToString() +
                                      " stopped answering");
      }
    }
    absl::Status s = inner_->TransferSyncRead(peer, local, remote, length);
    std::shared_ptr<AfterRead> hook;
    {
      connex::MutexLock lock(&mu_);
      hook = after_read_;
    }
    if (s.ok() && hook) (*hook)(local, remote, length);
    return s;
  }
  absl::StatusOr<void*> AllocateManagedBuffer(size_t length) override {
    size_t limit = fail_alloc_bytes_.load();
    if (limit != 0 && length >= limit) {
      return absl::ResourceExhaustedError("fault injection: allocation of " +
                                          std::to_string(length) + " bytes refused");
    }
    return inner_->AllocateManagedBuffer(length);
  }
  absl::Status FreeManagedBuffer(void* buffer) override {
    return inner_->FreeManagedBuffer(buffer);
  }
  absl::Status CopyToManagedBuffer(void* dst, const void* src, size_t length) override {
    return inner_->CopyToManagedBuffer(dst, src, length);
  }
  absl::Status CopyFromManagedBuffer(void* dst, const void* src, size_t length) override {
    return inner_->CopyFromManagedBuffer(dst, src, length);
  }
  std::vector<std::string> LocalAddresses() const override { return inner_->LocalAddresses(); }
  transport::Capabilities GetCapabilities() const override { return inner_->GetCapabilities(); }
  absl::Status Connect(const transport::PeerRef& peer) override { return inner_->Connect(peer); }
  uint64_t SubscribePeerEvents(transport::PeerEventCallback cb) override {
    return inner_->SubscribePeerEvents(std::move(cb));
  }
  void UnsubscribePeerEvents(uint64_t id) override { inner_->UnsubscribePeerEvents(id); }

 private:
  transport::TransferEnginePtr inner_;
  std::atomic<size_t> fail_alloc_bytes_{0};
  connex::Mutex mu_;
  std::shared_ptr<AfterRead> after_read_ ABSL_GUARDED_BY(mu_);
  Lid held_lid_ ABSL_GUARDED_BY(mu_);
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  int held_reads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace connex::pp::testing

#endif  // CONNEX_PP_TESTING_FAULT_ENGINE_H_
