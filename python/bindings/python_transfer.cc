// connex.transport.from_python: a Python object implementing the reference's transfer-engine
// protocol (the methods of Mooncake's Python TransferEngine) used as the C++ stack's
// TransferEngine, so a StageNode's steps travel over a Python data plane. Every call takes the
// GIL on the calling C++ thread; after the interpreter began to shut down, calls fail with
// Unavailable without calling Python.
#include <cstring>
#include <map>
#include <string>

#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "python/bindings/transport.h"

namespace connex::python {
namespace {

constexpr std::string_view kScheme = "py://";

class PythonTransferEngine final : public transport::TransferEngine {
 public:
  // GIL held. TypeError naming a missing method.
  PythonTransferEngine(py::object engine, std::string address) : address_(std::move(address)) {
    for (const char* method : {"register_memory", "unregister_memory", "transfer_sync_read",
                               "allocate_managed_buffer", "free_managed_buffer"}) {
      if (!py::hasattr(engine, method)) {
        throw py::type_error(StrCat("from_python: the data plane (a ", TypeName(engine),
                                    ") has no method ", method));
      }
    }
    has_copy_to_ = py::hasattr(engine, "write_bytes_to_buffer");
    has_copy_from_ = py::hasattr(engine, "read_bytes_from_buffer");
    engine_ = engine.release().ptr();
  }
  ~PythonTransferEngine() override {
    if (Finalizing()) return;  // at shutdown the reference is left to the OS
    py::gil_scoped_acquire gil;
    Py_XDECREF(engine_);
  }

  absl::Status RegisterMemory(void* addr, size_t length) override {
    if (length == 0) return absl::InvalidArgumentError("python transfer engine: empty range");
    return Call("register_memory", absl::StatusCode::kInvalidArgument,
                [&](py::object e) { return e.attr("register_memory")(Addr(addr), length); });
  }
  absl::Status UnregisterMemory(void* addr) override {
    return Call("unregister_memory", absl::StatusCode::kInvalidArgument,
                [&](py::object e) { return e.attr("unregister_memory")(Addr(addr)); });
  }
  absl::Status TransferSyncRead(const transport::PeerRef& peer, void* local, uint64_t remote_addr,
                                size_t length) override {
    std::string target;
    for (const std::string& a : peer.addresses) {
      if (a.rfind(kScheme, 0) == 0) {
        target = a.substr(kScheme.size());
        break;
      }
    }
    if (target.empty()) {
      return absl::UnavailableError(StrCat("python transfer engine: ", peer.lid.ToString(),
                                           " publishes no ", kScheme, " address"));
    }
    return Call(StrCat("transfer_sync_read from ", peer.lid.ToString(), " (", target, ")"),
                absl::StatusCode::kUnavailable, [&](py::object e) {
                  return e.attr("transfer_sync_read")(target, Addr(local), remote_addr, length);
                });
  }
  absl::StatusOr<void*> AllocateManagedBuffer(size_t length) override {
    if (Finalizing()) return Gone("allocate_managed_buffer");
    py::gil_scoped_acquire gil;
    uintptr_t addr = 0;
    try {
      addr = object().attr("allocate_managed_buffer")(length).cast<uintptr_t>();
    } catch (py::error_already_set& e) {
      return StatusFromPython(e, absl::StatusCode::kResourceExhausted,
                              "python transfer engine: allocate_managed_buffer");
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(
          "python transfer engine: allocate_managed_buffer must return an address (int)");
    }
    if (addr == 0) {
      return absl::ResourceExhaustedError(
          StrCat("python transfer engine: allocate_managed_buffer(", length, ") failed"));
    }
    connex::MutexLock lock(&mu_);
    managed_[addr] = length;
    return reinterpret_cast<void*>(addr);
  }
  absl::Status FreeManagedBuffer(void* buffer) override {
    size_t length = 0;
    {
      connex::MutexLock lock(&mu_);
      auto it = managed_.find(Addr(buffer));
      if (it == managed_.end()) {
        return absl::InvalidArgumentError(StrCat("python transfer engine: free_managed_buffer: ",
                                                 Hex(buffer), " is not a managed buffer"));
      }
      length = it->second;
      managed_.erase(it);
    }
    return Call("free_managed_buffer", absl::StatusCode::kInvalidArgument,
                [&](py::object e) { return e.attr("free_managed_buffer")(Addr(buffer), length); });
  }
  absl::Status CopyToManagedBuffer(void* dst, const void* src, size_t length) override {
    CONNEX_RETURN_IF_ERROR(CheckManaged(dst, length, "copy_to_managed_buffer"));
    if (!has_copy_to_) {
      std::memcpy(dst, src, length);
      return absl::OkStatus();
    }
    return Call("write_bytes_to_buffer", absl::StatusCode::kInternal, [&](py::object e) {
      return e.attr("write_bytes_to_buffer")(
          Addr(dst), py::bytes(static_cast<const char*>(src), length), length);
    });
  }
  absl::Status CopyFromManagedBuffer(void* dst, const void* src, size_t length) override {
    CONNEX_RETURN_IF_ERROR(CheckManaged(src, length, "copy_from_managed_buffer"));
    if (!has_copy_from_) {
      std::memcpy(dst, src, length);
      return absl::OkStatus();
    }
    if (Finalizing()) return Gone("read_bytes_from_buffer");
    py::gil_scoped_acquire gil;
    try {
      py::bytes got = object().attr("read_bytes_from_buffer")(Addr(src), length);
      std::string_view bytes = got;
      if (bytes.size() != length) {
        return absl::InternalError(StrCat("python transfer engine: read_bytes_from_buffer gave ",
                                          bytes.size(), " bytes, not ", length));
      }
      std::memcpy(dst, bytes.data(), length);
    } catch (py::error_already_set& e) {
      return StatusFromPython(e, absl::StatusCode::kInternal,
                              "python transfer engine: read_bytes_from_buffer");
    } catch (const std::exception& e) {
      return absl::InternalError(
          StrCat("python transfer engine: read_bytes_from_buffer must return bytes: ", e.what()));
    }
    return absl::OkStatus();
  }
  std::vector<std::string> LocalAddresses() const override { return {StrCat(kScheme, address_)}; }
  transport::Capabilities GetCapabilities() const override {
    transport::Capabilities c;
    c.backend = "python";
    c.cross_process = true;
    return c;
  }
  absl::Status Connect(const transport::PeerRef&) override { return absl::OkStatus(); }
  // A Python data plane reports no peer events: the step protocol then learns of a dead peer
  // from the directory and from step timeouts.
  uint64_t SubscribePeerEvents(transport::PeerEventCallback) override {
    connex::MutexLock lock(&mu_);
    return next_subscription_++;
  }
  void UnsubscribePeerEvents(uint64_t) override {}

 private:
  static uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
  static std::string Hex(const void* p) { return fmt::format("{:#x}", Addr(p)); }
  static absl::Status Gone(std::string_view what) {
    return absl::UnavailableError(
        StrCat("python transfer engine: ", what, ": the interpreter is shutting down"));
  }
  py::object object() const { return py::reinterpret_borrow<py::object>(engine_); }

  absl::Status CheckManaged(const void* p, size_t length, const char* what) {
    connex::MutexLock lock(&mu_);
    auto it = managed_.upper_bound(Addr(p));
    if (it != managed_.begin()) {
      --it;
      if (Addr(p) >= it->first && Addr(p) + length <= it->first + it->second) {
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(StrCat("python transfer engine: ", what, ": ", length,
                                             " bytes at ", Hex(p),
                                             " are not inside a managed buffer"));
  }

  // Calls a method that returns None or 0 on success, a negative number on failure (Mooncake's
  // convention), or raises.
  template <typename F>
  absl::Status Call(std::string_view what, absl::StatusCode fallback, F&& call) {
    if (Finalizing()) return Gone(what);
    py::gil_scoped_acquire gil;
    std::string context = StrCat("python transfer engine: ", what);
    try {
      py::object result = call(object());
      if (result.is_none()) return absl::OkStatus();
      if (py::isinstance<py::int_>(result) && result.cast<int64_t>() < 0) {
        return absl::Status(fallback, StrCat(context, " returned ", result.cast<int64_t>()));
      }
      return absl::OkStatus();
    } catch (py::error_already_set& e) {
      return StatusFromPython(e, fallback, context);
    } catch (const std::exception& e) {  // a result of the wrong type
      return absl::Status(fallback, StrCat(context, ": ", e.what()));
    }
  }

  const std::string address_;
  bool has_copy_to_ = false;
  bool has_copy_from_ = false;
  PyObject* engine_ = nullptr;  // owned reference
  connex::Mutex mu_;
  std::map<uintptr_t, size_t> managed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace

void RegisterPythonTransfer(py::module_& m) {
  m.def(
      "from_python",
      [](py::object engine, py::object lid, const std::string& address) {
        Lid l = ToLid(lid);
        if (address.empty()) {
          RaiseStatus(absl::InvalidArgumentError(
              "from_python: address is empty (pass what peers give your transfer_sync_read as "
              "target, e.g. your engine's 'host:port')"));
        }
        auto adapter = std::make_unique<PythonTransferEngine>(engine, address);
        return std::make_unique<PyTransferEngine>(std::move(adapter), std::move(l));
      },
      py::arg("engine"), py::arg("lid"), py::arg("address"),
      "A TransferEngine over a Python data plane `engine` implementing the reference's "
      "transfer-engine protocol (the methods of Mooncake's Python TransferEngine): "
      "register_memory(addr, length), unregister_memory(addr), transfer_sync_read(target, "
      "local_addr, remote_addr, length), allocate_managed_buffer(length) -> addr, "
      "free_managed_buffer(addr, length), and optionally write_bytes_to_buffer(addr, data, "
      "length) and read_bytes_from_buffer(addr, length) -> bytes (else the copies are memcpy). "
      "Methods return None or 0, or a negative number (or raise) on failure. The endpoint "
      "publishes 'py://' + address; a peer's `target` is its address. Usable as a StageNode's "
      "transport. Reports no peer events (capabilities.peer_events is False).");
}

}  // namespace connex::python
