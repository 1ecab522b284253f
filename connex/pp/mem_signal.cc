#include "connex/pp/mem_signal.h"

#include <chrono>

#include "connex/base/clock.h"
#include "connex/base/strings.h"

namespace connex::pp {

class MemSignalNetwork::Endpoint : public SignalTransport {
 public:
  Endpoint(std::shared_ptr<MemSignalNetwork> network, std::string address)
      : network_(std::move(network)), address_(std::move(address)) {}
  ~Endpoint() override { Close(); }
  const std::string& address() const override { return address_; }
  void SetReceiver(Receiver receiver) override {
    auto slot = std::make_shared<Slot>();
    slot->receiver = std::move(receiver);
    connex::MutexLock lock(&network_->mu_);
    network_->receivers_[address_] = std::move(slot);
  }
  void Send(const std::string& address, std::string frame) override {
    network_->Deliver(address_, address, std::move(frame));
  }
  void Close() override { network_->Unregister(address_); }

 private:
  std::shared_ptr<MemSignalNetwork> network_;
  std::string address_;
};

std::shared_ptr<MemSignalNetwork> MemSignalNetwork::Create(uint64_t seed) {
  std::shared_ptr<MemSignalNetwork> network(new MemSignalNetwork(seed));
  network->timer_ = std::thread([n = network.get()] { n->TimerLoop(); });
  return network;
}

MemSignalNetwork::MemSignalNetwork(uint64_t seed) : rng_(seed) {}

MemSignalNetwork::~MemSignalNetwork() { Stop(); }

void MemSignalNetwork::Stop() {
  {
    connex::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) timer_.join();
}

std::unique_ptr<SignalTransport> MemSignalNetwork::NewEndpoint() {
  connex::MutexLock lock(&mu_);
  std::string address = StrCat("pp+mem://", next_id_++);
  return std::make_unique<Endpoint>(shared_from_this(), address);
}

void MemSignalNetwork::SetFaults(SignalFaults faults) {
  connex::MutexLock lock(&mu_);
  faults_ = faults;
}

void MemSignalNetwork::Kill(const std::string& address) { Unregister(address); }

void MemSignalNetwork::Unregister(const std::string& address) {
  std::shared_ptr<Slot> slot;
  {
    connex::MutexLock lock(&mu_);
    dead_[address] = true;
    auto it = receivers_.find(address);
    if (it == receivers_.end()) return;
    slot = std::move(it->second);
    receivers_.erase(it);
  }
  std::lock_guard<std::mutex> lock(slot->mu);  // waits for a delivery in progress
  slot->receiver = nullptr;
}

void MemSignalNetwork::Call(const std::shared_ptr<Slot>& slot, std::string frame) {
  std::lock_guard<std::mutex> lock(slot->mu);
  if (slot->receiver) slot->receiver(std::move(frame));
}

uint64_t MemSignalNetwork::sent() const {
  connex::MutexLock lock(&mu_);
  return sent_;
}
uint64_t MemSignalNetwork::dropped() const {
  connex::MutexLock lock(&mu_);
  return dropped_;
}
uint64_t MemSignalNetwork::duplicated() const {
  connex::MutexLock lock(&mu_);
  return duplicated_;
}

void MemSignalNetwork::SetFilter(Filter filter) {
  connex::MutexLock lock(&mu_);
  std::shared_ptr<ActiveFilter> replaced = std::move(filter_);
  filter_ = filter ? std::make_shared<ActiveFilter>(std::move(filter)) : nullptr;
  // The replaced filter may capture what its test destroys next: return once no call of it runs
  // (calls that start from now on get the new one).
  if (replaced) {
    mu_.Await(absl::Condition(
        +[](ActiveFilter* f) { return f->calls == 0; }, replaced.get()));
  }
}

std::shared_ptr<MemSignalNetwork::ActiveFilter> MemSignalNetwork::StartFilterCall() {
  connex::MutexLock lock(&mu_);
  if (filter_) ++filter_->calls;
  return filter_;
}

void MemSignalNetwork::Deliver(const std::string& from, const std::string& to, std::string frame) {
  std::shared_ptr<Slot> receiver;
  int copies = 1;
  if (std::shared_ptr<ActiveFilter> filter = StartFilterCall()) {
    const bool keep = filter->fn(to, frame);
    {
      connex::MutexLock lock(&mu_);
      --filter->calls;
    }
    if (!keep) return;
  }
  {
    connex::MutexLock lock(&mu_);
    ++sent_;
    if (dead_.count(from) || dead_.count(to)) return;
    std::uniform_real_distribution<double> coin(0, 1);
    if (faults_.drop > 0 && coin(rng_) < faults_.drop) {
      ++dropped_;
      return;
    }
    if (faults_.duplicate > 0 && coin(rng_) < faults_.duplicate) {
      ++duplicated_;
      copies = 2;
    }
    if (faults_.delay > 0 && faults_.max_delay_ms > 0 && coin(rng_) < faults_.delay) {
      int64_t due = RealClock::Get()->NowMs() + 1 +
                    static_cast<int64_t>(rng_() % static_cast<uint64_t>(faults_.max_delay_ms));
      for (int i = 0; i < copies; ++i) delayed_.emplace(due + i, std::make_pair(to, frame));
      return;
    }
    auto it = receivers_.find(to);
    if (it == receivers_.end()) return;
    receiver = it->second;
  }
  for (int i = 0; i < copies; ++i) Call(receiver, i + 1 < copies ? frame : std::move(frame));
}

void MemSignalNetwork::TimerLoop() {
  while (true) {
    std::vector<std::pair<std::shared_ptr<Slot>, std::string>> due;
    {
      connex::MutexLock lock(&mu_);
      if (stop_) return;
      int64_t now = RealClock::Get()->NowMs();
      while (!delayed_.empty() && delayed_.begin()->first <= now) {
        auto node = delayed_.extract(delayed_.begin());
        auto& [to, frame] = node.mapped();
        auto it = receivers_.find(to);
        if (it != receivers_.end()) due.emplace_back(it->second, std::move(frame));
      }
    }
    for (auto& [receiver, frame] : due) Call(receiver, std::move(frame));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace connex::pp
