// TerminationSignals: how a long-running binary takes SIGINT and SIGTERM — synchronously, on the
// thread that asks, never in a handler. Construct it in main before any thread starts: it blocks
// both signals in the calling thread, and every thread started later inherits the mask, so the
// signal stays pending until Wait or WaitFor takes it. Thread-compatible.
#ifndef CONNEX_BASE_SIGNALS_H_
#define CONNEX_BASE_SIGNALS_H_

#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <ctime>

namespace connex {

class TerminationSignals {
 public:
  // Blocks SIGINT and SIGTERM in this thread.
  TerminationSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }

  // Blocks until SIGINT or SIGTERM arrives; returns it.
  int Wait() const {
    int signal = 0;
    while (sigwait(&set_, &signal) != 0) {
    }
    return signal;
  }

  // Waits at most `timeout_ms`; returns the signal, or 0 when none came.
  int WaitFor(int64_t timeout_ms) const {
    timespec timeout{static_cast<time_t>(timeout_ms / 1000),
                     static_cast<long>((timeout_ms % 1000) * 1'000'000)};
    int signal = sigtimedwait(&set_, nullptr, &timeout);
    return signal > 0 ? signal : 0;
  }

 private:
  sigset_t set_;
};

}  // namespace connex

#endif  // CONNEX_BASE_SIGNALS_H_
