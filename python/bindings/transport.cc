// connex.transport: transfer engines (mem, tcp, shm, ucx, auto) over Python buffers without
// copies — register_memory holds the caller's buffer (numpy array, bytearray, memoryview, ...)
// and hands its memory to the engine; transfer_sync_read lands bytes directly in the caller's
// buffer — managed buffers with the buffer protocol, and peer events as callbacks.
#include "python/bindings/transport.h"

#include "connex/base/strings.h"
#include "connex/transport/mem/mem_engine.h"

namespace connex::python {

using transport::Capabilities;
using transport::PeerEvent;
using transport::PeerEventKind;
using transport::TransferEngine;

namespace {

std::string Hex(uintptr_t addr) { return fmt::format("{:#x}", addr); }

// Whether `value` exports a buffer with `flags`.
bool Probe(py::handle value, int flags) {
  Py_buffer probe;
  if (PyObject_GetBuffer(value.ptr(), &probe, flags) != 0) {
    PyErr_Clear();
    return false;
  }
  PyBuffer_Release(&probe);
  return true;
}

// A contiguous view of `value`'s memory, released with the object. `writable`: refuse a
// read-only buffer with connex.InvalidArgument naming `what`.
class BufferView {
 public:
  BufferView(py::handle value, bool writable, const std::string& what) {
    int flags = PyBUF_ANY_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(value.ptr(), &view_, flags) == 0) return;
    // Why not? Read-only, not contiguous, or no buffer at all: ask again with less to tell.
    bool no_buffer = PyErr_ExceptionMatches(PyExc_TypeError);
    PyErr_Clear();
    if (!no_buffer && writable && Probe(value, PyBUF_ANY_CONTIGUOUS)) {
      RaiseStatus(absl::InvalidArgumentError(StrCat(
          what, ": the ", TypeName(value),
          " buffer is read-only, and this memory is written to; pass a writable buffer "
          "(bytearray, numpy array, memoryview of one)",
          what == "register_memory" ? ", or writable=False to let peers only read it" : "")));
    }
    if (!no_buffer && Probe(value, PyBUF_STRIDES)) {
      throw py::value_error(StrCat(what, ": the ", TypeName(value),
                                   " buffer is not contiguous (pass a contiguous array)"));
    }
    throw py::type_error(StrCat(what,
                                ": expected an object with the buffer protocol (numpy array, "
                                "bytearray, memoryview), not ",
                                TypeName(value)));
  }
  ~BufferView() {
    if (view_.obj != nullptr || view_.buf != nullptr) PyBuffer_Release(&view_);
  }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  void* data() const { return view_.buf; }
  size_t size() const { return static_cast<size_t>(view_.len); }
  // Hands the view over (the caller releases it).
  Py_buffer Release() {
    Py_buffer v = view_;
    view_ = Py_buffer{};
    return v;
  }

 private:
  Py_buffer view_{};
};

// ---- managed buffers ----

// Memory owned by an engine, registered with it; exposes the buffer protocol (writable), so
// numpy.frombuffer(buf, dtype) and memoryview(buf) see it without a copy. Views keep it alive;
// free() refuses while a view exists (BufferError), as bytearray does for a resize.
class PyManagedBuffer {
 public:
  PyManagedBuffer(std::shared_ptr<EngineState> state, void* data, size_t size)
      : state_(std::move(state)), data_(data), size_(size) {
    closer_ = RegisterCloser(kCloseIterators, [this] { state_.reset(); });
  }
  ~PyManagedBuffer() {
    UnregisterCloser(closer_);
    if (state_ != nullptr && exports_ == 0) {
      std::shared_ptr<EngineState> state = std::move(state_);
      WithoutGil([&] { (void)state->engine->FreeManagedBuffer(data_); });
      // `state` may be the last reference: destroyed here, on this thread.
    }
  }

  void Free() {
    if (exports_ > 0) {
      throw py::buffer_error(StrCat("ManagedBuffer.free: ", exports_,
                                    " views (memoryview, numpy array) of it still exist"));
    }
    if (state_ == nullptr) return;
    std::shared_ptr<EngineState> state = std::move(state_);
    ThrowIfError(Blocking([&] { return state->engine->FreeManagedBuffer(data_); }));
  }
  void* Data(const char* what) const {
    if (state_ == nullptr) {
      RaiseStatus(absl::FailedPreconditionError(StrCat(what, ": the managed buffer was freed")));
    }
    return data_;
  }
  TransferEngine& Engine() const { return *state_->engine; }
  size_t size() const { return size_; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(data_); }
  bool freed() const { return state_ == nullptr; }

  static int GetBuffer(PyObject* self, Py_buffer* view, int flags) {
    PyManagedBuffer* b = nullptr;
    try {
      b = py::handle(self).cast<PyManagedBuffer*>();
    } catch (const std::exception&) {
      PyErr_SetString(PyExc_BufferError, "ManagedBuffer: not initialized");
      return -1;
    }
    if (b->state_ == nullptr) {
      PyErr_SetString(PyExc_BufferError, "ManagedBuffer: the buffer was freed");
      return -1;
    }
    if (PyBuffer_FillInfo(view, self, b->data_, static_cast<Py_ssize_t>(b->size_), 0, flags) != 0) {
      return -1;
    }
    ++b->exports_;
    return 0;
  }
  static void ReleaseBuffer(PyObject* self, Py_buffer*) {
    try {
      --py::handle(self).cast<PyManagedBuffer*>()->exports_;
    } catch (const std::exception&) {
    }
  }

 private:
  std::shared_ptr<EngineState> state_;  // null once freed
  void* data_;
  size_t size_;
  int exports_ = 0;  // GIL
  uint64_t closer_ = 0;
};

// The managed side of a copy: a ManagedBuffer (plus offset) or a raw address.
void* ManagedPointer(py::handle value, size_t offset, size_t length, const char* what) {
  if (py::isinstance<PyManagedBuffer>(value)) {
    const PyManagedBuffer& b = value.cast<const PyManagedBuffer&>();
    void* data = b.Data(what);
    if (offset > b.size() || length > b.size() - offset) {
      RaiseStatus(absl::InvalidArgumentError(StrCat(what, ": ", length, " bytes at offset ", offset,
                                                    " overrun the managed buffer of ", b.size(),
                                                    " bytes")));
    }
    return static_cast<char*>(data) + offset;
  }
  if (py::isinstance<py::int_>(value)) {
    return reinterpret_cast<void*>(value.cast<uintptr_t>() + offset);
  }
  throw py::type_error(
      StrCat(what, ": expected a ManagedBuffer or an address (int), not ", TypeName(value)));
}

transport::TransportOptions MakeOptions(const std::string& backend, py::object lid,
                                        const std::string& host,
                                        std::shared_ptr<transport::mem::Fabric> fabric,
                                        int heartbeat_ms, int suspect_ms, int connect_timeout_ms,
                                        int tcp_connections, const std::string& shm_dir) {
  transport::TransportOptions o;
  o.backend = ValueOrThrow(transport::ParseBackend(backend));
  o.local_lid = ToLid(lid);
  o.host = host;
  o.fabric = std::move(fabric);
  o.heartbeat_ms = heartbeat_ms;
  o.suspect_ms = suspect_ms;
  o.connect_timeout_ms = connect_timeout_ms;
  o.tcp_connections = tcp_connections;
  o.shm_dir = shm_dir;
  return o;
}

std::unique_ptr<PyTransferEngine> Create(const transport::TransportOptions& options) {
  auto engine = Blocking([&] { return transport::CreateTransferEngine(options); });
  return std::make_unique<PyTransferEngine>(ValueOrThrow(std::move(engine)), options.local_lid);
}

const char* kCreateDoc =
    "Creates a transfer engine for the endpoint `lid`. backend: 'mem' (in-process, needs "
    "`fabric`), 'tcp', 'shm' (same host), 'ucx', or 'auto' (every backend that starts, picked "
    "per peer). connex.Unavailable when the backend cannot start.";

}  // namespace

EngineState::~EngineState() {
  WithoutGil([&] { engine.reset(); });
  if (registrations.empty() || Finalizing()) return;  // at shutdown the OS takes them back
  py::gil_scoped_acquire gil;
  for (auto& [addr, r] : registrations) PyBuffer_Release(&r.view);
}

PyTransferEngine::PyTransferEngine(transport::TransferEnginePtr engine, Lid lid)
    : state_(std::make_shared<EngineState>()) {
  state_->engine = std::move(engine);
  state_->lid = std::move(lid);
  closer_ = RegisterCloser(kCloseEngines, [this] { Close(); });
}

PyTransferEngine::~PyTransferEngine() {
  UnregisterCloser(closer_);
  Close();
}

void PyTransferEngine::Close() {
  for (auto& [id, slot] : subscriptions_) slot->Clear();
  subscriptions_.clear();
  WithoutGil([&] { dispatcher_->Stop(); });
  std::shared_ptr<EngineState> state = std::move(state_);
  // Destroyed here unless a peer set or a managed buffer still holds it. The engine's
  // destructor runs without the GIL (EngineState).
  state.reset();
}

std::shared_ptr<EngineState> PyTransferEngine::Get() const {
  if (state_ == nullptr) throw std::runtime_error("TransferEngine is closed");
  return state_;
}

uint64_t PyTransferEngine::SubscribePeerEvents(py::function callback) {
  auto state = Get();
  auto slot = std::make_shared<CallbackSlot>(callback);
  uint64_t id = Blocking(
      [&] { return state->engine->SubscribePeerEvents(dispatcher_->Poster<PeerEvent>(slot)); });
  subscriptions_.emplace(id, slot);
  return id;
}

void PyTransferEngine::UnsubscribePeerEvents(uint64_t id) {
  auto it = subscriptions_.find(id);
  if (it == subscriptions_.end()) {
    RaiseStatus(absl::NotFoundError(StrCat("unsubscribe_peer_events: no subscription ", id)));
  }
  it->second->Clear();
  subscriptions_.erase(it);
  auto state = Get();
  WithoutGil([&] { state->engine->UnsubscribePeerEvents(id); });
}

void RegisterTransport(py::module_& m) {
  using transport::mem::Fabric;

  py::enum_<PeerEventKind>(m, "PeerEventKind", "What the transport saw of a peer.")
      .value("CONNECTED", PeerEventKind::kConnected)
      .value("DEAD", PeerEventKind::kDead)
      .value("SUSPECTED", PeerEventKind::kSuspected);

  py::class_<PeerEvent>(m, "PeerEvent", "A transport's event about a peer.")
      .def_readonly("kind", &PeerEvent::kind)
      .def_readonly("lid", &PeerEvent::lid)
      .def_readonly("address", &PeerEvent::address)
      .def_readonly("detail", &PeerEvent::detail)
      .def("__repr__", [](const PeerEvent& e) {
        return StrCat("PeerEvent(", transport::PeerEventKindName(e.kind), " ", e.lid.ToString(),
                      " ", e.address, e.detail.empty() ? "" : ": " + e.detail, ")");
      });

  py::class_<Capabilities>(m, "Capabilities", "What a backend can do.")
      .def_readonly("backend", &Capabilities::backend)
      .def_readonly("peer_events", &Capabilities::peer_events)
      .def_readonly("hung_peer_detection", &Capabilities::hung_peer_detection)
      .def_readonly("same_host_only", &Capabilities::same_host_only)
      .def_readonly("cross_process", &Capabilities::cross_process)
      .def("__repr__", [](const Capabilities& c) {
        return StrCat("Capabilities(backend=", c.backend, ", peer_events=", c.peer_events,
                      ", hung_peer_detection=", c.hung_peer_detection,
                      ", same_host_only=", c.same_host_only, ", cross_process=", c.cross_process,
                      ")");
      });

  py::class_<Fabric, std::shared_ptr<Fabric>>(
      m, "Fabric",
      "The in-process 'network' of the mem backend, with fault injection. Engines created with "
      "backend='mem' and this fabric can read each other's registered memory.")
      .def(py::init([](uint64_t seed, int partition_timeout_ms) {
             transport::mem::FabricOptions o;
             o.seed = seed;
             o.partition_timeout_ms = partition_timeout_ms;
             return Fabric::Create(o);
           }),
           py::arg("seed") = 1, py::arg("partition_timeout_ms") = 200)
      .def(
          "kill",
          [](Fabric& f, py::object lid) {
            Lid l = ToLid(lid);
            Blocking([&] { f.Kill(l); });
          },
          py::arg("lid"), "The endpoint's process is gone: its peers get DEAD, reads fail.")
      .def(
          "partition",
          [](Fabric& f, py::object a, py::object b) {
            Lid la = ToLid(a), lb = ToLid(b);
            Blocking([&] { f.Partition(la, lb); });
          },
          py::arg("a"), py::arg("b"))
      .def(
          "heal",
          [](Fabric& f, py::object a, py::object b) {
            Lid la = ToLid(a), lb = ToLid(b);
            Blocking([&] { f.Heal(la, lb); });
          },
          py::arg("a"), py::arg("b"))
      .def("heal_all", [](Fabric& f) { Blocking([&] { f.HealAll(); }); })
      .def(
          "is_alive",
          [](const Fabric& f, py::object lid) {
            Lid l = ToLid(lid);
            return Blocking([&] { return f.IsAlive(l); });
          },
          py::arg("lid"))
      .def_property_readonly("reads_started", &Fabric::reads_started);

  py::class_<PyManagedBuffer>(m, "ManagedBuffer", py::buffer_protocol(),
                              "Registered memory owned by a transfer engine. Supports the buffer "
                              "protocol (writable): numpy.frombuffer(buf, dtype) and "
                              "memoryview(buf) use it without a copy. `address` is what a peer "
                              "passes as remote_addr to read it.")
      .def_property_readonly("address", &PyManagedBuffer::address)
      .def_property_readonly("freed", &PyManagedBuffer::freed)
      .def("__len__", &PyManagedBuffer::size)
      .def("free", &PyManagedBuffer::Free,
           "Frees it now (BufferError while a view exists); otherwise it is freed when garbage "
           "collected.");
  {
    // Our own buffer slots, which count the views (pybind11's do not).
    py::handle cls = m.attr("ManagedBuffer");
    auto* heap = reinterpret_cast<PyHeapTypeObject*>(cls.ptr());
    heap->as_buffer.bf_getbuffer = &PyManagedBuffer::GetBuffer;
    heap->as_buffer.bf_releasebuffer = &PyManagedBuffer::ReleaseBuffer;
  }

  py::class_<PyTransferEngine>(
      m, "TransferEngine",
      "Moves bytes between registered memory regions of two endpoints with one-sided reads, "
      "and reports peers' liveness as events. The seven methods of the reference's "
      "transfer-engine protocol: register_memory, unregister_memory, transfer_sync_read, "
      "allocate_managed_buffer, free_managed_buffer, copy_to_managed_buffer, "
      "copy_from_managed_buffer. Thread-safe; every call releases the GIL while it works.")
      .def(
          "register_memory",
          [](PyTransferEngine& self, py::object buffer, bool writable) {
            auto state = self.Get();
            BufferView view(buffer, writable, "register_memory");
            void* data = view.data();
            size_t size = view.size();
            ThrowIfError(Blocking([&] { return state->engine->RegisterMemory(data, size); }));
            state->registrations[reinterpret_cast<uintptr_t>(data)] =
                EngineState::Registration{view.Release(), size, writable};
            return reinterpret_cast<uintptr_t>(data);
          },
          py::arg("buffer"), py::arg("writable") = true,
          "Registers the memory of `buffer` (anything with the buffer protocol: numpy array, "
          "bytearray, memoryview) without a copy, so that peers may read it and reads may land "
          "in it; returns its address (what a peer passes as remote_addr). The buffer is held "
          "(it cannot be resized or freed) until unregister_memory or close. A read-only buffer "
          "(bytes) needs writable=False: peers may read it, no read may land in it. "
          "connex.InvalidArgument if it overlaps a registered range or is empty.")
      .def(
          "unregister_memory",
          [](PyTransferEngine& self, py::object buffer_or_address) {
            auto state = self.Get();
            uintptr_t addr = 0;
            if (py::isinstance<py::int_>(buffer_or_address)) {
              addr = buffer_or_address.cast<uintptr_t>();
            } else {
              BufferView view(buffer_or_address, false, "unregister_memory");
              addr = reinterpret_cast<uintptr_t>(view.data());
            }
            ThrowIfError(Blocking(
                [&] { return state->engine->UnregisterMemory(reinterpret_cast<void*>(addr)); }));
            auto it = state->registrations.find(addr);
            if (it != state->registrations.end()) {
              PyBuffer_Release(&it->second.view);
              state->registrations.erase(it);
            }
          },
          py::arg("buffer"),
          "Unregisters the range registered from `buffer` (or at that address). Waits for reads "
          "in flight that use it; then releases the buffer.")
      .def(
          "transfer_sync_read",
          [](PyTransferEngine& self, py::object peer, py::object local, uint64_t remote_addr,
             std::optional<size_t> length) {
            auto state = self.Get();
            transport::PeerRef ref = ToPeerRef(peer);
            std::optional<BufferView> view;
            void* dst = nullptr;
            size_t n = 0;
            if (py::isinstance<py::int_>(local)) {
              if (!length) throw py::type_error("transfer_sync_read: a local address needs length");
              uintptr_t addr = local.cast<uintptr_t>();
              auto it = state->registrations.upper_bound(addr);
              if (it != state->registrations.begin()) {
                --it;
                if (addr < it->first + it->second.length && !it->second.writable) {
                  RaiseStatus(absl::InvalidArgumentError(
                      StrCat("transfer_sync_read: local ", Hex(addr),
                             " is inside a region registered read-only (writable=False)")));
                }
              }
              dst = reinterpret_cast<void*>(addr);
              n = *length;
            } else {
              view.emplace(local, true, "transfer_sync_read");
              dst = view->data();
              n = length.value_or(view->size());
              if (n > view->size()) {
                RaiseStatus(absl::InvalidArgumentError(StrCat("transfer_sync_read: length ", n,
                                                              " exceeds the local buffer's ",
                                                              view->size(), " bytes")));
              }
            }
            ThrowIfError(Blocking(
                [&] { return state->engine->TransferSyncRead(ref, dst, remote_addr, n); }));
          },
          py::arg("peer"), py::arg("local"), py::arg("remote_addr"), py::arg("length") = py::none(),
          "Reads `length` bytes (default: all of `local`) at `remote_addr` of `peer`'s registered "
          "memory straight into `local`: a writable buffer inside a registered region (numpy "
          "array, bytearray, memoryview slice) or an address. `peer` is a PeerRef, a directory "
          "Record or a (lid, [addresses]) pair. connex.Unavailable: the peer is gone; "
          "connex.InvalidArgument: a range is not registered; connex.Fenced: the address "
          "answers with another LID.")
      .def(
          "allocate_managed_buffer",
          [](PyTransferEngine& self, size_t length) {
            auto state = self.Get();
            void* data = ValueOrThrow(
                Blocking([&] { return state->engine->AllocateManagedBuffer(length); }));
            return std::make_unique<PyManagedBuffer>(state, data, length);
          },
          py::arg("length"), "A registered ManagedBuffer of `length` bytes owned by the engine.")
      .def(
          "free_managed_buffer", [](PyTransferEngine&, PyManagedBuffer& b) { b.Free(); },
          py::arg("buffer"), "Same as buffer.free().")
      .def(
          "copy_to_managed_buffer",
          [](PyTransferEngine& self, py::object dst, py::object src, size_t offset) {
            auto state = self.Get();
            BufferView from(src, false, "copy_to_managed_buffer");
            void* to = ManagedPointer(dst, offset, from.size(), "copy_to_managed_buffer");
            const void* data = from.data();
            size_t n = from.size();
            ThrowIfError(Blocking([&] { return state->engine->CopyToManagedBuffer(to, data, n); }));
          },
          py::arg("dst"), py::arg("src"), py::arg("offset") = 0,
          "Copies all of buffer `src` into managed buffer `dst` at `offset`.")
      .def(
          "copy_from_managed_buffer",
          [](PyTransferEngine& self, py::object dst, py::object src, size_t offset) {
            auto state = self.Get();
            BufferView to(dst, true, "copy_from_managed_buffer");
            void* from = ManagedPointer(src, offset, to.size(), "copy_from_managed_buffer");
            void* data = to.data();
            size_t n = to.size();
            ThrowIfError(
                Blocking([&] { return state->engine->CopyFromManagedBuffer(data, from, n); }));
          },
          py::arg("dst"), py::arg("src"), py::arg("offset") = 0,
          "Fills writable buffer `dst` from managed buffer `src` at `offset`.")
      .def(
          "connect",
          [](PyTransferEngine& self, py::object peer) {
            auto state = self.Get();
            transport::PeerRef ref = ToPeerRef(peer);
            ThrowIfError(Blocking([&] { return state->engine->Connect(ref); }));
          },
          py::arg("peer"), "Connects to `peer` and watches its liveness. connex.Unavailable.")
      .def("subscribe_peer_events", &PyTransferEngine::SubscribePeerEvents, py::arg("callback"),
           "Calls callback(PeerEvent), in order, on this engine's callback thread (with the GIL) "
           "for every peer this engine connected to; returns an id.")
      .def("unsubscribe_peer_events", &PyTransferEngine::UnsubscribePeerEvents, py::arg("id"))
      .def_property_readonly(
          "local_addresses",
          [](PyTransferEngine& self) {
            auto state = self.Get();
            return Blocking([&] { return state->engine->LocalAddresses(); });
          },
          "The addresses this endpoint publishes in the directory.")
      .def_property_readonly("capabilities",
                             [](PyTransferEngine& self) {
                               auto state = self.Get();
                               return Blocking([&] { return state->engine->GetCapabilities(); });
                             })
      .def_property_readonly("lid", [](PyTransferEngine& self) { return self.Get()->lid; })
      .def("close", &PyTransferEngine::Close,
           "Drops the callbacks and destroys the engine (once no peer set or managed buffer "
           "uses it); registered buffers are released after it.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyTransferEngine& self, py::args) { self.Close(); });

  m.def(
      "create_transfer_engine",
      [](const std::string& backend, py::object lid, const std::string& host,
         std::shared_ptr<Fabric> fabric, int heartbeat_ms, int suspect_ms, int connect_timeout_ms,
         int tcp_connections, const std::string& shm_dir) {
        return Create(MakeOptions(backend, lid, host, std::move(fabric), heartbeat_ms, suspect_ms,
                                  connect_timeout_ms, tcp_connections, shm_dir));
      },
      py::arg("backend"), py::arg("lid"), py::kw_only(), py::arg("host") = "127.0.0.1",
      py::arg("fabric") = nullptr, py::arg("heartbeat_ms") = 250, py::arg("suspect_ms") = 1000,
      py::arg("connect_timeout_ms") = 2000, py::arg("tcp_connections") = 4,
      py::arg("shm_dir") = "/dev/shm", kCreateDoc);
  static constexpr std::pair<const char*, const char*> kBackends[] = {
      {"tcp", "create_transfer_engine('tcp', lid, ...): the tcp backend."},
      {"shm", "create_transfer_engine('shm', lid, ...): shared memory, same host."},
      {"ucx", "create_transfer_engine('ucx', lid, ...): UCP RMA get over UCX."},
      {"auto", "create_transfer_engine('auto', lid, ...): every backend that starts."},
  };
  for (const auto& [backend, doc] : kBackends) {
    std::string name = backend;
    m.def(
        backend,
        [name](py::object lid, const std::string& host, std::shared_ptr<Fabric> fabric,
               int heartbeat_ms, int suspect_ms, int connect_timeout_ms, int tcp_connections,
               const std::string& shm_dir) {
          return Create(MakeOptions(name, lid, host, std::move(fabric), heartbeat_ms, suspect_ms,
                                    connect_timeout_ms, tcp_connections, shm_dir));
        },
        py::arg("lid"), py::kw_only(), py::arg("host") = "127.0.0.1", py::arg("fabric") = nullptr,
        py::arg("heartbeat_ms") = 250, py::arg("suspect_ms") = 1000,
        py::arg("connect_timeout_ms") = 2000, py::arg("tcp_connections") = 4,
        py::arg("shm_dir") = "/dev/shm", doc);
  }
  m.def(
      "mem",
      [](py::object lid, std::shared_ptr<Fabric> fabric) {
        if (fabric == nullptr) throw py::type_error("mem: a connex.transport.Fabric is required");
        return Create(MakeOptions("mem", lid, "127.0.0.1", std::move(fabric), 250, 1000, 2000, 4,
                                  "/dev/shm"));
      },
      py::arg("lid"), py::arg("fabric"),
      "A mem (in-process) engine for `lid` attached to `fabric`.");
  m.def(
      "from_env",
      [](py::object lid) {
        Lid l = ToLid(lid);
        return Create(ValueOrThrow(transport::TransportOptions::FromEnv(l)));
      },
      py::arg("lid"), "An engine as CONNEX_PP_BACKEND and CONNEX_TRANSPORT_* configure it.");
}

}  // namespace connex::python
