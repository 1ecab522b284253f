// Shared helpers of the Python bindings (connex._connex): absl::Status to Python exceptions, LID
// and peer conversions from Python values, the GIL rules for C++ threads calling Python, and the
// registry that closes live objects before the interpreter finalizes.
//
// GIL rules: every call into the core runs with the GIL released; C++ threads never wait for the
// GIL — they post events to a Dispatcher, whose thread takes it to call Python (CallbackSlot);
// C++ objects are destroyed without it. Once the interpreter shuts down (atexit), callbacks are
// dropped and every live object is closed.
#ifndef CONNEX_PYTHON_BINDINGS_COMMON_H_
#define CONNEX_PYTHON_BINDINGS_COMMON_H_

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/transport/transfer_engine.h"

namespace connex::python {

namespace py = pybind11;

// The name of `value`'s Python type ("dict", "ndarray"), for error messages.
inline std::string TypeName(py::handle value) {
  return py::str(py::type::handle_of(value).attr("__name__"));
}

// ---- errors (errors.cc) ----
// Creates connex.Error and its subclasses in `m`.
void RegisterErrors(py::module_& m);
// Raises the exception of `status`'s code with its message (the GIL must be held).
[[noreturn]] void RaiseStatus(const absl::Status& status);
// The exception object of `status` (the GIL must be held), e.g. for a future's set_exception.
py::object StatusToException(const absl::Status& status);
// The status of a Python exception raised by user code that the core called (an engine, a
// transfer engine): a connex.Error keeps its code, any other exception gets `fallback`; the
// message is "`what`: Type: text".
absl::Status StatusFromPython(const py::error_already_set& e, absl::StatusCode fallback,
                              std::string_view what);
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) RaiseStatus(value.status());
  return *std::move(value);
}

// ---- LIDs and peers (lid.cc) ----
void RegisterLid(py::module_& m);
// A Lid, a ("model", group, shard, replica) tuple or a "model/g1/s0/r1" string; TypeError or
// connex.InvalidArgument naming what is wrong otherwise.
Lid ToLid(py::handle value, std::string_view what = "lid");
// A PeerRef, a directory Record, or a (lid, [addresses]) pair.
transport::PeerRef ToPeerRef(py::handle value);

// ---- the GIL ----
// True once the interpreter shuts down (the atexit hook ran): C++ threads no longer call into
// Python.
bool Finalizing();
// Runs `fn` without the GIL (releasing it if this thread holds it and the interpreter is not
// finalizing).
void WithoutGil(const std::function<void()>& fn);

// Releases the GIL for its scope. A thread that comes back after the interpreter began to
// finalize (a daemon thread whose blocking call outlived the program) is parked for good
// instead of taking the GIL: CPython would end it with pthread_exit, whose forced unwinding
// through C++ frames aborts the process.
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

// Runs `f` without the GIL and returns its result (which must not hold Python objects).
template <typename F>
auto Blocking(F&& f) {
  GilRelease release;
  return f();
}

// A Python callable that C++ threads may call. The C++ side captures a shared_ptr to the slot,
// never the callable itself; Clear() (GIL held) drops the callable, after which Call does
// nothing. Exceptions of the callable are reported as unraisable (sys.unraisablehook), never
// propagated into C++.
class CallbackSlot {
 public:
  explicit CallbackSlot(py::object fn) : fn_(fn.release().ptr()) {}
  ~CallbackSlot();
  CallbackSlot(const CallbackSlot&) = delete;
  CallbackSlot& operator=(const CallbackSlot&) = delete;

  // GIL held.
  void Clear();
  // Any thread, GIL not held: takes the GIL and calls the callable with make_args()'s result.
  template <typename MakeArgs>
  void Call(MakeArgs&& make_args) {
    CallUnpacked([&] { return py::make_tuple(make_args()); });
  }
  // Same, with the tuple that make_args() returns as the arguments.
  template <typename MakeArgs>
  void CallUnpacked(MakeArgs&& make_args) {
    if (Finalizing()) return;
    py::gil_scoped_acquire gil;
    if (fn_ == nullptr || Finalizing()) return;
    py::object fn = py::reinterpret_borrow<py::object>(fn_);
    try {
      py::tuple args = make_args();
      fn(*args);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("connex callback");
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      PyErr_WriteUnraisable(fn.ptr());
    }
  }

 private:
  PyObject* fn_;  // owned reference; guarded by the GIL
};
using CallbackSlotPtr = std::shared_ptr<CallbackSlot>;

// The thread that calls one object's Python callbacks, in the order they were posted. The C++
// threads that produce events (a directory client's loop, which also heartbeats; a transport's
// event thread) only post to it, so they never wait for the GIL: a Python thread that holds the
// GIL for seconds (a long computation) delays its callbacks, never the heartbeats that keep its
// leases alive. Thread-safe. Started at the first Post; Stop drops what is queued.
class Dispatcher : public std::enable_shared_from_this<Dispatcher> {
 public:
  static std::shared_ptr<Dispatcher> Create() {
    return std::shared_ptr<Dispatcher>(new Dispatcher);
  }
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Any thread, with or without the GIL; a no-op once stopped.
  void Post(std::function<void()> task);
  // Stops and joins the thread (call without the GIL: it may be waiting for it). From within a
  // task (a callback that closes its own object) the thread is left to finish on its own.
  void Stop();

  // The posting callback of `slot` for events of type E.
  template <typename E>
  std::function<void(const E&)> Poster(CallbackSlotPtr slot) {
    std::shared_ptr<Dispatcher> self = shared_from_this();
    return [self, slot](const E& event) {
      self->Post([slot, event] { slot->Call([&] { return py::cast(event); }); });
    };
  }

 private:
  Dispatcher() = default;
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;                       // guarded by mu_
};
using DispatcherPtr = std::shared_ptr<Dispatcher>;

// Owns `raw` and destroys it without the GIL.
template <typename T>
std::shared_ptr<T> OwnWithoutGil(std::unique_ptr<T> raw) {
  return std::shared_ptr<T>(raw.release(), [](T* p) { WithoutGil([p] { delete p; }); });
}

// Live objects that must be closed before the interpreter finalizes. Each wrapper registers its
// close function; an atexit hook closes them (lower `order` first: dependents before what they
// depend on). Called with the GIL held.
uint64_t RegisterCloser(int order, std::function<void()> close);
void UnregisterCloser(uint64_t id);
void RegisterShutdown(py::module_& m);

// ---- the parts of the module ----
void RegisterDirectory(py::module_& m);
void RegisterTransport(py::module_& m);
void RegisterElastic(py::module_& m);
void RegisterPythonTransfer(py::module_& m);  // python_transfer.cc
void RegisterPp(py::module_& m);              // pp.cc
void RegisterPpState(py::module_& m);         // pp_state.cc

// Closer orders.
inline constexpr int kCloseIterators = 0;
inline constexpr int kClosePeerSets = 1;
inline constexpr int kCloseClients = 2;
inline constexpr int kCloseEngines = 3;
inline constexpr int kCloseServers = 4;

}  // namespace connex::python

#endif  // CONNEX_PYTHON_BINDINGS_COMMON_H_
