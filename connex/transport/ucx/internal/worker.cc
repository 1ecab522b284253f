// Worker (worker.h): the UCP context and worker's setup and teardown, and the progress thread —
// it progresses the worker while there is work, spins for spin_us, then arms the worker and sleeps
// on its event fd; it stands aside while a reader busy-polls for its own request.
#include "connex/transport/ucx/internal/worker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdlib>

#include "connex/base/curve.h"
#include "connex/base/strings.h"

namespace connex::transport::ucx {

absl::Status UcsError(std::string_view what, ucs_status_t status) {
  return absl::UnavailableError(StrCat("ucx: ", what, ": ", ucs_status_string(status)));
}

Worker::~Worker() {
  stop_ = true;
  uint64_t one = 1;
  if (wake_.valid()) (void)!write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::Status Worker::Init(int spin_us, const std::string& host) {
  spin_us_ = spin_us;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcsError("config", st);
  if (IsLoopbackHost(host) && std::getenv("UCX_NET_DEVICES") == nullptr) {
    st = ucp_config_modify(config, "NET_DEVICES", "lo");
    if (st != UCS_OK) {
      ucp_config_release(config);
      return UcsError("config NET_DEVICES=lo", st);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcsError("init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return UcsError("worker", st);
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return UcsError("worker fd", st);
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) return UcsError("worker address", st);
  address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker_, addr);
  wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Worker::Run() {
  int64_t idle_since = internal::NowUs();
  while (!stop_) {
    if (waiters_.load() > 0) {
      pollfd wake = {wake_.get(), POLLIN, 0};
      poll(&wake, 1, 1);
      idle_since = internal::NowUs();
      continue;
    }
    unsigned progressed;
    {
      MutexLock lock(&mu);
      progressed = ucp_worker_progress(worker_);
    }
    int64_t now = internal::NowUs();
    if (progressed > 0) {
      idle_since = now;
      continue;
    }
    if (now - idle_since < spin_us_) continue;
    ucs_status_t st;
    {
      MutexLock lock(&mu);
      st = ucp_worker_arm(worker_);
    }
    if (st == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{efd_, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    poll(fds, 2, 100);
    idle_since = internal::NowUs();
  }
}

}  // namespace connex::transport::ucx
