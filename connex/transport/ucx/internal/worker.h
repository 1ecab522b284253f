// Worker: the ucx backend's UCP context and worker (UCS_THREAD_MODE_SERIALIZED: every UCP call is
// made under `mu`), and the progress thread that serves one-sided operations that need the
// target's help (UCX's tcp transport emulates RMA with active messages). Thread-safe under `mu`;
// private to connex/transport/ucx (ucx_engine.cc and its rooms).
#ifndef CONNEX_TRANSPORT_UCX_INTERNAL_WORKER_H_
#define CONNEX_TRANSPORT_UCX_INTERNAL_WORKER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "connex/base/mutex.h"
#include "connex/transport/internal/socket.h"

namespace connex::transport::ucx {

// Unavailable, naming the UCX call and UCX's reason.
absl::Status UcsError(std::string_view what, ucs_status_t status);

class Worker {
 public:
  ~Worker();

  // `host`: the address this endpoint listens on. UCX's own tcp transport listens on every
  // network device unless told otherwise; an endpoint on loopback keeps it on `lo` (unless
  // UCX_NET_DEVICES says which devices to use).
  absl::Status Init(int spin_us, const std::string& host);

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::string& address() const { return address_; }
  Mutex mu;

  // A reader busy-polling the worker for its own request (WaitFor) progresses everything; the
  // progress thread then stays out of its way instead of contending for `mu` and the CPU.
  class ActiveWaiter {
   public:
    explicit ActiveWaiter(Worker& w) : w_(w) { w_.waiters_.fetch_add(1); }
    ~ActiveWaiter() { w_.waiters_.fetch_sub(1); }

   private:
    Worker& w_;
  };

 private:
  void Run();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  int spin_us_ = 0;
  std::string address_;
  internal::Fd wake_;
  std::atomic<bool> stop_{false};
  std::atomic<int> waiters_{0};
  std::thread thread_;
};

}  // namespace connex::transport::ucx

#endif  // CONNEX_TRANSPORT_UCX_INTERNAL_WORKER_H_
