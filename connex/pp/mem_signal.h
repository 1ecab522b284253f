// The in-process fake of the signal transport, with fault injection for the step protocol's
// tests: drop, delay and duplicate messages (from a seeded RNG), and kill an endpoint. Thread-safe;
// delayed messages are delivered by the network's own timer thread.
#ifndef CONNEX_PP_MEM_SIGNAL_H_
#define CONNEX_PP_MEM_SIGNAL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "connex/base/mutex.h"
#include "connex/pp/signal_transport.h"

namespace connex::pp {

struct SignalFaults {
  double drop = 0;       // probability a message is lost
  double duplicate = 0;  // probability a message is delivered twice
  double delay = 0;      // probability a message is delayed
  int max_delay_ms = 0;  // delays are uniform in [1, max_delay_ms]
};

class MemSignalNetwork : public std::enable_shared_from_this<MemSignalNetwork> {
 public:
  static std::shared_ptr<MemSignalNetwork> Create(uint64_t seed);
  ~MemSignalNetwork();

  std::unique_ptr<SignalTransport> NewEndpoint();
  void SetFaults(SignalFaults faults);
  // Sees every frame before the faults apply; returning false loses it. Runs on the sender's
  // thread with no lock held; must not block. Tests use it to watch or drop chosen signals.
  using Filter = std::function<bool(const std::string& to, const std::string& frame)>;
  // Returns once no call of the filter it replaces runs (so that what that filter captured may be
  // destroyed); not to be called from a filter.
  void SetFilter(Filter filter);
  // Every message to or from `address` is lost from now on (a dead process).
  void Kill(const std::string& address);
  void Stop();  // stops the timer thread; pending delayed messages are lost

  uint64_t sent() const;
  uint64_t dropped() const;
  uint64_t duplicated() const;

 private:
  class Endpoint;
  explicit MemSignalNetwork(uint64_t seed);
  void Deliver(const std::string& from, const std::string& to, std::string frame);
  void Unregister(const std::string& address);
  void TimerLoop();

  // An endpoint's receiver. Called with `mu` held, so that once Close has taken `mu` and cleared
  // it, no call is running and none will start (the receiver's owner may then be destroyed).
  struct Slot {
    std::mutex mu;
    SignalTransport::Receiver receiver;  // empty once closed
  };
  void Call(const std::shared_ptr<Slot>& slot, std::string frame);

  // The filter and its calls in flight (`calls` under `mu_`).
  struct ActiveFilter {
    explicit ActiveFilter(Filter f) : fn(std::move(f)) {}
    Filter fn;
    int calls = 0;
  };
  // The filter to call for a frame, counted as running until the caller takes it off; null if
  // none.
  std::shared_ptr<ActiveFilter> StartFilterCall();

  mutable connex::Mutex mu_;
  std::map<std::string, std::shared_ptr<Slot>> receivers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> dead_ ABSL_GUARDED_BY(mu_);
  std::multimap<int64_t, std::pair<std::string, std::string>> delayed_ ABSL_GUARDED_BY(mu_);
  SignalFaults faults_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ActiveFilter> filter_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t duplicated_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_MEM_SIGNAL_H_
