// connex._connex: the extension module behind the `connex` package (python/connex/).
#include <map>
#include <vector>

#include "connex/base/logging.h"
#include "connex/base/logging_spdlog.h"
#include "connex/directory/etcd/etcd_backend.h"
#include "python/bindings/common.h"
#include "python/bindings/engine.h"

namespace connex::python {
namespace {

// Whether CPython is finalizing (public from 3.13 on).
bool PythonFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

std::atomic<bool> finalizing{false};

struct Closer {
  int order;
  std::function<void()> close;
};
// Guarded by the GIL.
std::map<uint64_t, Closer>& Closers() {
  static auto* closers = new std::map<uint64_t, Closer>();
  return *closers;
}
uint64_t next_closer = 1;

// The atexit hook: stop calling Python from C++ threads, then close every live object.
void Shutdown() {
  finalizing.store(true);
  for (int order = kCloseIterators; order <= kCloseServers; ++order) {
    std::vector<uint64_t> ids;
    for (const auto& [id, closer] : Closers()) {
      if (closer.order == order) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      auto it = Closers().find(id);
      if (it == Closers().end()) continue;
      std::function<void()> close = std::move(it->second.close);
      Closers().erase(it);
      try {
        close();
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("connex shutdown");
      }
    }
  }
}

}  // namespace

bool Finalizing() { return finalizing.load(std::memory_order_relaxed) || PythonFinalizing(); }

void WithoutGil(const std::function<void()>& fn) {
  if (!PythonFinalizing() && PyGILState_Check()) {
    GilRelease release;
    fn();
  } else {
    fn();
  }
}

GilRelease::~GilRelease() {
  while (PythonFinalizing()) std::this_thread::sleep_for(std::chrono::hours(1));
  PyEval_RestoreThread(state_);
}

CallbackSlot::~CallbackSlot() {
  if (fn_ == nullptr || Finalizing()) return;  // at shutdown the reference is left to the OS
  py::gil_scoped_acquire gil;
  Py_XDECREF(fn_);
}

void CallbackSlot::Clear() {
  PyObject* fn = fn_;
  fn_ = nullptr;
  Py_XDECREF(fn);
}

Dispatcher::~Dispatcher() {
  // Only reached once the thread has finished or was never started (it holds a reference).
  if (thread_.joinable()) thread_.detach();
}

void Dispatcher::Post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  if (!thread_.joinable()) {
    thread_ = std::thread([self = shared_from_this()] { self->Run(); });
  }
  tasks_.push_back(std::move(task));
  cv_.notify_all();
}

void Dispatcher::Run() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (stop_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();  // takes the GIL itself (CallbackSlot::Call)
  }
}

void Dispatcher::Stop() {
  std::deque<std::function<void()>> dropped;
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    dropped.swap(tasks_);
    thread = std::move(thread_);
    cv_.notify_all();
  }
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();
  } else {
    thread.join();
  }
}

uint64_t RegisterCloser(int order, std::function<void()> close) {
  uint64_t id = next_closer++;
  Closers().emplace(id, Closer{order, std::move(close)});
  return id;
}

void UnregisterCloser(uint64_t id) { Closers().erase(id); }

void RegisterShutdown(py::module_& m) {
  py::module_::import("atexit").attr("register")(py::cpp_function(&Shutdown));
  m.def(
      "_live_objects", [] { return Closers().size(); },
      "Objects the atexit hook would close (for tests).");
}

}  // namespace connex::python

PYBIND11_MODULE(_connex, m) {
  connex::directory::RegisterEtcdBackend();  // etcd:// addresses too
  namespace cp = connex::python;
  m.doc() =
      "Connex: endpoint mobility primitives for dynamic LLM serving (the C++ core). Use the "
      "`connex` package and its submodules rather than this module directly.";
  m.attr("__version__") = CONNEX_VERSION;
  cp::RegisterErrors(m);
  cp::RegisterLid(m);
  cp::RegisterDirectory(m);
  cp::RegisterTransport(m);
  cp::RegisterElastic(m);
  cp::RegisterPythonTransfer(m);
  cp::RegisterPp(m);
  cp::RegisterEngine(m);
  cp::RegisterPpState(m);
  cp::RegisterShutdown(m);
  m.def(
      "set_log_level",
      [](const std::string& level) {
        connex::Log().set_level(cp::ValueOrThrow(connex::ParseLogLevel(level)));
      },
      pybind11::arg("level"),
      "Sets the level of the core's log (stderr): trace, debug, info, warn, error or off. The "
      "default comes from CONNEX_LOG_LEVEL (else info). connex.InvalidArgument for another name.");
}
