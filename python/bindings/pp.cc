// connex.pp: the step protocol's StageNode, with the engine behind it written in Python (an object
// implementing the engine contract over dicts of numpy arrays, connex.pp.Engine) and completions
// delivered as concurrent.futures.Future objects and callbacks on the node's callback thread.
#include "python/bindings/pp.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/node.h"
#include "connex/pp/signal_transport.h"
#include "python/bindings/directory.h"
#include "python/bindings/engine.h"

namespace connex::python {

using pp::DType;
using pp::StageNode;
using pp::StageNodeOptions;
using pp::StageNodeStats;
using pp::TensorDict;

namespace {

std::optional<py::dtype> NumpyDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return py::dtype("float32");
    case DType::kF16:
      return py::dtype("float16");
    case DType::kI32:
      return py::dtype("int32");
    case DType::kI64:
      return py::dtype("int64");
    case DType::kBF16:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<DType> FromNumpy(const py::dtype& dtype) {
  if (!dtype.attr("isnative").cast<bool>()) return std::nullopt;
  switch (dtype.kind()) {
    case 'f':
      if (dtype.itemsize() == 4) return DType::kF32;
      if (dtype.itemsize() == 2) return DType::kF16;
      break;
    case 'i':
      if (dtype.itemsize() == 4) return DType::kI32;
      if (dtype.itemsize() == 8) return DType::kI64;
      break;
    default:
      break;
  }
  return std::nullopt;
}

// Reports an exception of an engine method that has no status to return.
void Unraisable(py::error_already_set& e, const char* what) {
  e.discard_as_unraisable(StrCat("connex python engine ", what).c_str());
}

}  // namespace

absl::StatusOr<py::dict> ToNumpyDict(const TensorDict& dict) {
  py::dict out;
  for (const auto& [name, tensor] : dict.tensors()) {
    std::optional<py::dtype> dtype = NumpyDType(tensor.dtype);
    if (!dtype) {
      return absl::InvalidArgumentError(StrCat("tensor '", name, "' is ",
                                               pp::DTypeName(tensor.dtype),
                                               ", which numpy cannot represent"));
    }
    py::array array(*dtype, tensor.shape);
    if (!tensor.data.empty()) {
      std::memcpy(array.mutable_data(), tensor.data.data(), tensor.data.size());
    }
    out[py::str(name)] = std::move(array);
  }
  return out;
}

absl::StatusOr<TensorDict> FromNumpyDict(py::handle mapping, std::string_view what) {
  if (!py::isinstance<py::dict>(mapping) &&
      !py::isinstance(mapping, py::module_::import("collections.abc").attr("Mapping"))) {
    return absl::InvalidArgumentError(
        StrCat(what, ": expected a dict of numpy arrays, got ", TypeName(mapping)));
  }
  TensorDict dict;
  for (py::handle key : py::iter(mapping)) {
    if (!py::isinstance<py::str>(key)) {
      return absl::InvalidArgumentError(
          StrCat(what, ": a key is a ", TypeName(key), ", not a str"));
    }
    std::string name = key.cast<std::string>();
    py::object value = mapping[key];
    py::array array = py::array::ensure(value, py::array::c_style);
    if (!array) {
      return absl::InvalidArgumentError(
          StrCat(what, ": '", name, "' is a ", TypeName(value), ", not an array"));
    }
    std::optional<DType> dtype = FromNumpy(array.dtype());
    if (!dtype) {
      return absl::InvalidArgumentError(StrCat(what, ": '", name, "' has dtype ",
                                               std::string(py::str(array.dtype())),
                                               "; use float32, float16, int32 or int64"));
    }
    pp::Tensor tensor;
    tensor.dtype = *dtype;
    for (py::ssize_t i = 0; i < array.ndim(); ++i) tensor.shape.push_back(array.shape(i));
    tensor.data.resize(static_cast<size_t>(array.nbytes()));
    if (!tensor.data.empty()) std::memcpy(tensor.data.data(), array.data(), tensor.data.size());
    dict.Set(std::move(name), std::move(tensor));
  }
  return dict;
}

// ---- the engine adapter ----

PythonEngine::PythonEngine(py::object engine) {
  for (const char* method : {"execute_step", "holds_request", "release", "num_held_requests"}) {
    if (!py::hasattr(engine, method)) {
      throw py::type_error(StrCat("StageNode: the engine (a ", TypeName(engine), ") has no method ",
                                  method, " (see connex.pp.Engine for the contract)"));
    }
  }
  if (py::hasattr(engine, "output_bytes_per_token")) {
    py::object n = engine.attr("output_bytes_per_token")();
    if (!n.is_none()) bytes_per_token_ = n.cast<uint64_t>();
  }
  exports_state_ = ReadExportsState(engine);
  engine_ = engine.release().ptr();
}

PythonEngine::~PythonEngine() {
  if (Finalizing()) return;  // at shutdown the reference is left to the OS
  py::gil_scoped_acquire gil;
  Py_XDECREF(engine_);
}

absl::StatusOr<TensorDict> PythonEngine::ExecuteStep(const TensorDict& in) {
  return WithGil("execute_step", [&]() -> absl::StatusOr<TensorDict> {
    // Nothing may escape to the node's thread: an exception there would end the process.
    try {
      return ExecuteStepLocked(in);
    } catch (py::error_already_set& e) {
      return StatusFromPython(e, absl::StatusCode::kInternal, "python engine: execute_step");
    } catch (const std::exception& e) {
      return absl::InternalError(StrCat("python engine: execute_step: ", e.what()));
    }
  });
}

absl::StatusOr<TensorDict> PythonEngine::ExecuteStepLocked(const TensorDict& in) {
  {
    absl::StatusOr<py::dict> args = ToNumpyDict(in);
    if (!args.ok()) return Annotate(args.status(), "python engine: execute_step");
    py::object result = object().attr("execute_step")(*args);
    absl::StatusOr<TensorDict> out = FromNumpyDict(result, "python engine: execute_step result");
    if (!out.ok()) return out.status();
    // The keys the contract has every stage pass on: the batch, and the sampling of a stage that
    // does not sample.
    for (const auto& [name, tensor] : in.tensors()) {
      bool batch = name == pp::kRequestIds || name == pp::kStartPositions || name == pp::kNumTokens;
      if ((batch || name.rfind("sampling.", 0) == 0) && !out->Contains(name)) {
        out->Set(name, tensor);
      }
    }
    return out;
  }
}

std::vector<uint64_t> PythonEngine::MissingRequests(const TensorDict& in) const {
  if (Finalizing()) return {};
  py::gil_scoped_acquire gil;
  std::vector<uint64_t> missing;
  try {
    py::object self = object();
    if (py::hasattr(self, "missing_requests")) {
      absl::StatusOr<py::dict> args = ToNumpyDict(in);
      if (!args.ok()) return {};  // ExecuteStep reports it
      for (py::handle id : self.attr("missing_requests")(*args)) {
        missing.push_back(id.cast<uint64_t>());
      }
      return missing;
    }
    absl::StatusOr<pp::Batch> batch = pp::GetBatch(in);
    if (!batch.ok()) return {};
    for (size_t i = 0; i < batch->request_ids.size(); ++i) {
      uint64_t id = batch->request_ids[i];
      if (batch->start_positions[i] != 0 && !self.attr("holds_request")(id).cast<bool>()) {
        missing.push_back(id);
      }
    }
  } catch (py::error_already_set& e) {
    missing.clear();  // the step runs, and the engine refuses it if it must
    Unraisable(e, "missing_requests");
  } catch (const std::exception& e) {
    missing.clear();
    PyErr_SetString(PyExc_TypeError,
                    StrCat("missing_requests must return request ids (int): ", e.what()).c_str());
    PyErr_WriteUnraisable(engine_);
  }
  return missing;
}

bool PythonEngine::HoldsRequest(uint64_t request_id) const {
  if (Finalizing()) return false;
  py::gil_scoped_acquire gil;
  try {
    return py::bool_(object().attr("holds_request")(request_id));
  } catch (py::error_already_set& e) {
    Unraisable(e, "holds_request");
  } catch (const std::exception&) {
  }
  return false;
}

void PythonEngine::Release(uint64_t request_id) {
  if (Finalizing()) return;
  py::gil_scoped_acquire gil;
  try {
    object().attr("release")(request_id);
  } catch (py::error_already_set& e) {
    Unraisable(e, "release");
  } catch (const std::exception&) {
  }
}

size_t PythonEngine::NumHeldRequests() const {
  if (Finalizing()) return 0;
  py::gil_scoped_acquire gil;
  try {
    return object().attr("num_held_requests")().cast<size_t>();
  } catch (py::error_already_set& e) {
    Unraisable(e, "num_held_requests");
  } catch (const std::exception&) {
  }
  return 0;
}

// ---- a shared transfer engine ----

namespace {

class SharedTransferEngine final : public transport::TransferEngine {
 public:
  explicit SharedTransferEngine(std::shared_ptr<EngineState> state) : state_(std::move(state)) {}
  ~SharedTransferEngine() override {
    // The last reference may be this one: the engine's destructor runs without the GIL
    // (EngineState), and releasing registered Python buffers takes it.
    state_.reset();
  }

  absl::Status RegisterMemory(void* addr, size_t length) override {
    return e().RegisterMemory(addr, length);
  }
  absl::Status UnregisterMemory(void* addr) override { return e().UnregisterMemory(addr); }
  absl::Status TransferSyncRead(const transport::PeerRef& peer, void* local, uint64_t remote_addr,
                                size_t length) override {
    return e().TransferSyncRead(peer, local, remote_addr, length);
  }
  absl::StatusOr<void*> AllocateManagedBuffer(size_t length) override {
    return e().AllocateManagedBuffer(length);
  }
  absl::Status FreeManagedBuffer(void* buffer) override { return e().FreeManagedBuffer(buffer); }
  absl::Status CopyToManagedBuffer(void* dst, const void* src, size_t length) override {
    return e().CopyToManagedBuffer(dst, src, length);
  }
  absl::Status CopyFromManagedBuffer(void* dst, const void* src, size_t length) override {
    return e().CopyFromManagedBuffer(dst, src, length);
  }
  std::vector<std::string> LocalAddresses() const override { return e().LocalAddresses(); }
  transport::Capabilities GetCapabilities() const override { return e().GetCapabilities(); }
  absl::Status Connect(const transport::PeerRef& peer) override { return e().Connect(peer); }
  uint64_t SubscribePeerEvents(transport::PeerEventCallback cb) override {
    return e().SubscribePeerEvents(std::move(cb));
  }
  void UnsubscribePeerEvents(uint64_t id) override { e().UnsubscribePeerEvents(id); }

 private:
  transport::TransferEngine& e() const { return *state_->engine; }
  std::shared_ptr<EngineState> state_;
};

}  // namespace

transport::TransferEnginePtr ShareTransferEngine(std::shared_ptr<EngineState> state) {
  return std::make_unique<SharedTransferEngine>(std::move(state));
}

// ---- the node ----

namespace {

py::dict StatsDict(const StageNodeStats& s) {
  py::dict d;
  d["steps_executed"] = s.steps_executed;
  d["steps_replayed"] = s.steps_replayed;
  d["duplicates_dropped"] = s.duplicates_dropped;
  d["fenced"] = s.fenced;
  d["missing_reported"] = s.missing_reported;
  d["late_dropped"] = s.late_dropped;
  d["resends"] = s.resends;
  d["failovers"] = s.failovers;
  d["reprefills"] = s.reprefills;
  d["aborted"] = s.aborted;
  d["completed"] = s.completed;
  d["backpressured"] = s.backpressured;
  d["forged_dropped"] = s.forged_dropped;
  d["released"] = s.released;
  d["chunked"] = s.chunked;
  d["held_requests"] = s.held_requests;
  d["replay_bytes"] = s.replay_bytes;
  d["releases_pending"] = s.releases_pending;
  d["ring_in_use"] = s.ring_in_use;
  d["requests_in_flight"] = s.requests_in_flight;
  d["steps_in_flight"] = s.steps_in_flight;
  d["epoch"] = s.epoch;
  d["epoch_checks"] = s.epoch_checks;
  py::list epochs;
  for (const pp::EpochSteps& e : s.epochs) {
    py::dict entry;
    entry["epoch"] = e.epoch;
    entry["steps_executed"] = e.steps_executed;
    entry["last_step_monotonic_ns"] = e.last_step_monotonic_ns;
    epochs.append(std::move(entry));
  }
  d["epochs"] = std::move(epochs);
  return d;
}

// One request's Python side: its future, `done` and `on_token`. Guarded by the GIL.
struct PendingRequest {
  uint64_t request_id = 0;
  py::object future;
  CallbackSlotPtr on_token;
};

class PyStageNode {
 public:
  PyStageNode(PyDirectoryClient& directory, py::object engine, StageNodeOptions options,
              py::object transport, const std::string& signal_host)
      : client_(directory.Get()), engine_object_(engine), curve_(directory.options().curve) {
    if (py::isinstance<PyStageEngine>(engine)) {
      native_ = engine.cast<std::shared_ptr<PyStageEngine>>();  // run natively, no Python
    } else {
      engine_ = std::make_unique<PythonEngine>(engine);
    }
    Lid lid{options.model, options.stage, 0, options.replica};
    ThrowIfError(Lid::ValidateModel(options.model));
    transport::TransferEnginePtr transfer;
    if (transport.is_none() || py::isinstance<py::str>(transport)) {
      transport::TransportOptions topts =
          ValueOrThrow(Blocking([&] { return transport::TransportOptions::FromEnv(lid); }));
      if (!transport.is_none()) {
        topts.backend = ValueOrThrow(transport::ParseBackend(transport.cast<std::string>()));
      }
      transfer = ValueOrThrow(Blocking([&] { return transport::CreateTransferEngine(topts); }));
    } else if (py::isinstance<PyTransferEngine>(transport)) {
      std::shared_ptr<EngineState> state = transport.cast<PyTransferEngine&>().Get();
      if (!(state->lid == lid)) {
        RaiseStatus(absl::InvalidArgumentError(
            StrCat("StageNode ", lid.ToString(), ": the transport belongs to ",
                   state->lid.ToString(), " (create it for the node's LID)")));
      }
      transfer = ShareTransferEngine(std::move(state));
    } else {
      throw py::type_error(
          StrCat("StageNode: transport must be None, a backend name or a "
                 "connex.transport.TransferEngine (wrap a Python data plane with "
                 "connex.transport.from_python), not ",
                 TypeName(transport)));
    }
    std::unique_ptr<pp::SignalTransport> signals =
        ValueOrThrow(Blocking([&] { return pp::CreateZmqSignalTransport(signal_host, curve_); }));
    pp::Engine& e = native_ ? native_->TakeForNode() : *engine_;
    node_ = OwnWithoutGil(ValueOrThrow(Blocking([&] {
      return StageNode::Start(std::move(options), e, std::move(transfer), std::move(signals),
                              *client_);
    })));
    closer_ = RegisterCloser(kClosePeerSets, [this] { Close(); });
  }
  ~PyStageNode() {
    UnregisterCloser(closer_);
    Close();
  }

  std::shared_ptr<StageNode> Get() const {
    if (node_ == nullptr) throw std::runtime_error("StageNode is closed");
    return node_;
  }
  const CurveSettings& curve() const { return curve_; }

  py::object Submit(uint64_t request_id, std::vector<int32_t> prompt, int max_new_tokens,
                    py::object done, py::object on_token, int64_t timeout_ms,
                    std::optional<pp::Sampling> sampling) {
    auto node = Get();
    py::object future = py::module_::import("concurrent.futures").attr("Future")();
    future.attr("set_running_or_notify_cancel")();  // cancel through StageNode.cancel
    uint64_t serial = next_serial_++;
    PendingRequest pending{request_id, future, nullptr};
    pp::SubmitOptions options;
    options.timeout_ms = timeout_ms;
    if (sampling) options.sampling = *sampling;
    if (!on_token.is_none()) {
      pending.on_token = std::make_shared<CallbackSlot>(on_token);
      std::weak_ptr<Dispatcher> dispatcher = dispatcher_;
      options.on_token = [dispatcher, slot = pending.on_token](uint64_t id, int32_t token) {
        if (auto d = dispatcher.lock()) {
          d->Post(
              [slot, id, token] { slot->CallUnpacked([&] { return py::make_tuple(id, token); }); });
        }
      };
    }
    // `done` and the future are completed by one Python function on the callback thread.
    auto finish = std::make_shared<CallbackSlot>(py::cpp_function(
        [this, serial, done](py::object result) { Finish(serial, done, std::move(result)); }));
    std::weak_ptr<Dispatcher> dispatcher = dispatcher_;
    StageNode::Completion completion = [dispatcher, finish](
                                           uint64_t, absl::StatusOr<std::vector<int32_t>> tokens) {
      auto d = dispatcher.lock();
      if (d == nullptr) return;
      d->Post([finish, tokens = std::move(tokens)] {
        finish->CallUnpacked([&] {
          py::object result =
              tokens.ok() ? py::object(py::cast(*tokens)) : StatusToException(tokens.status());
          return py::make_tuple(std::move(result));
        });
        // The slot's function holds the user's callbacks: drop them here, with the GIL,
        // rather than on the node's thread.
        if (!Finalizing()) {
          py::gil_scoped_acquire gil;
          finish->Clear();
        }
      });
    };
    pending_.emplace(serial, std::move(pending));
    absl::Status submitted = Blocking([&] {
      return node->Submit(request_id, std::move(prompt), max_new_tokens, std::move(completion),
                          std::move(options));
    });
    if (!submitted.ok()) {
      pending_.erase(serial);
      finish->Clear();
      RaiseStatus(submitted);
    }
    return future;
  }

  void Close() {
    std::map<uint64_t, PendingRequest> pending = std::move(pending_);
    pending_.clear();
    for (auto& [serial, p] : pending) {
      if (p.on_token) p.on_token->Clear();
    }
    std::shared_ptr<StageNode> node = std::move(node_);
    if (node != nullptr) {
      WithoutGil([&] {
        node->Stop(/*leave=*/false);
        dispatcher_->Stop();
      });
      node.reset();  // destroyed without the GIL (OwnWithoutGil), before the engine it calls
    }
    if (!Finalizing()) {
      // Requests that never ended (the node stopped as a crash would).
      for (auto& [serial, p] : pending) {
        if (!p.future.attr("done")().cast<bool>()) {
          p.future.attr("set_exception")(
              StatusToException(absl::CancelledError("StageNode closed")));
        }
      }
    }
  }

  // Tokens the node streamed before the cancel may still wait in the callback queue: they are
  // dropped, so that no on_token runs once cancel() returned.
  void Cancel(uint64_t request_id, const std::string& why) {
    auto node = Get();
    ThrowIfError(Blocking([&] { return node->Cancel(request_id, absl::CancelledError(why)); }));
    for (auto& [serial, p] : pending_) {
      if (p.request_id == request_id && p.on_token) p.on_token->Clear();
    }
  }

  void Stop(bool leave, double drain_timeout) {
    auto node = Get();
    Blocking([&] { node->Stop(leave, static_cast<int64_t>(drain_timeout * 1000)); });
  }

  py::object engine() { return engine_object_; }

 private:
  void Finish(uint64_t serial, const py::object& done, py::object result) {
    auto it = pending_.find(serial);
    if (it == pending_.end()) return;  // closed meanwhile
    PendingRequest p = std::move(it->second);
    pending_.erase(it);
    if (p.on_token) p.on_token->Clear();
    bool ok = !PyExceptionInstance_Check(result.ptr());
    py::object request_result = result;
    try {
      if (!done.is_none()) done(request_result);
    } catch (...) {
      Complete(p.future, ok, result);
      throw;
    }
    Complete(p.future, ok, result);
  }
  static void Complete(const py::object& future, bool ok, const py::object& result) {
    if (future.attr("done")().cast<bool>()) return;
    future.attr(ok ? "set_result" : "set_exception")(result);
  }

  std::shared_ptr<directory::DirectoryClient> client_;
  py::object engine_object_;               // what the node was given
  std::unique_ptr<PythonEngine> engine_;   // a Python engine: calls into it
  std::shared_ptr<PyStageEngine> native_;  // or connex.StageEngine: run as it is
  // The CURVE settings of the node's signals (the directory client's): a migration keeps them.
  const CurveSettings curve_;
  std::shared_ptr<StageNode> node_;
  std::map<uint64_t, PendingRequest> pending_;  // by serial; GIL
  uint64_t next_serial_ = 1;                    // GIL
  const DispatcherPtr dispatcher_ = Dispatcher::Create();
  uint64_t closer_ = 0;
};

StageNodeOptions OptionsFromKwargs(const py::kwargs& kwargs) {
  StageNodeOptions o;
  py::object self = py::cast(&o, py::return_value_policy::reference);
  for (auto [key, value] : kwargs) {
    std::string name = py::str(key);
    if (name.empty() || name[0] == '_' || !py::hasattr(self, name.c_str()) || name == "from_env" ||
        name == "validate") {
      throw py::type_error(StrCat("StageNodeOptions: no option '", name, "'"));
    }
    self.attr(name.c_str()) = value;
  }
  return o;
}

}  // namespace

void RegisterPp(py::module_& m) {
  py::class_<pp::Sampling>(m, "Sampling",
                           "How the last stage chooses a request's tokens: temperature 0 (or "
                           "top_k 1) is greedy; otherwise the draw for the token at a position "
                           "depends only on (seed, position), so a failover draws the same "
                           "tokens.")
      .def(py::init([](float temperature, float top_p, int32_t top_k, uint64_t seed) {
             pp::Sampling s;
             s.temperature = temperature;
             s.top_p = top_p;
             s.top_k = top_k;
             s.seed = seed;
             ThrowIfError(s.Validate());
             return s;
           }),
           py::arg("temperature") = 0.0f, py::arg("top_p") = 1.0f, py::arg("top_k") = 0,
           py::arg("seed") = 0, "connex.InvalidArgument names a field out of range.")
      .def_readwrite("temperature", &pp::Sampling::temperature)
      .def_readwrite("top_p", &pp::Sampling::top_p)
      .def_readwrite("top_k", &pp::Sampling::top_k)
      .def_readwrite("seed", &pp::Sampling::seed)
      .def_property_readonly("greedy", &pp::Sampling::greedy)
      .def("__repr__", [](const pp::Sampling& s) {
        return StrCat("Sampling(temperature=", s.temperature, ", top_p=", s.top_p,
                      ", top_k=", s.top_k, ", seed=", s.seed, ")");
      });

  py::class_<StageNodeOptions>(
      m, "StageNodeOptions",
      "Settings of a StageNode: StageNodeOptions(model='m', stage=1, stages=3, replica=0, ...). "
      "Every field is a keyword; from_env() applies the CONNEX_PP_* variables.")
      .def(py::init(&OptionsFromKwargs),
           "Options with the given fields set (TypeError for an "
           "unknown one).")
      .def_readwrite("model", &StageNodeOptions::model)
      .def_readwrite("stage", &StageNodeOptions::stage)
      .def_readwrite("stages", &StageNodeOptions::stages)
      .def_readwrite("replica", &StageNodeOptions::replica)
      .def_readwrite("metadata", &StageNodeOptions::metadata)
      .def_readwrite("inflight", &StageNodeOptions::inflight)
      .def_readwrite("step_timeout_ms", &StageNodeOptions::step_timeout_ms)
      .def_readwrite("probe_timeout_ms", &StageNodeOptions::probe_timeout_ms)
      .def_readwrite("reprefill_max", &StageNodeOptions::reprefill_max)
      .def_readwrite("route_wait_ms", &StageNodeOptions::route_wait_ms)
      .def_readwrite("ring_slots", &StageNodeOptions::ring_slots)
      .def_readwrite("slot_bytes", &StageNodeOptions::slot_bytes)
      .def_readwrite("max_batch", &StageNodeOptions::max_batch)
      .def_readwrite("eos_token", &StageNodeOptions::eos_token)
      .def_readwrite("request_timeout_ms", &StageNodeOptions::request_timeout_ms)
      .def_readwrite("attempt_max", &StageNodeOptions::attempt_max)
      .def_readwrite("replay_cache_bytes", &StageNodeOptions::replay_cache_bytes)
      .def_readwrite("owner_grace_ms", &StageNodeOptions::owner_grace_ms)
      .def_readwrite("stall_confirm_ms", &StageNodeOptions::stall_confirm_ms)
      .def_readwrite("kv_standby", &StageNodeOptions::kv_standby)
      .def_readwrite("kv_standby_bytes", &StageNodeOptions::kv_standby_bytes)
      .def_readwrite("kv_standby_grace_ms", &StageNodeOptions::kv_standby_grace_ms)
      .def_readwrite("kv_standby_interval_ms", &StageNodeOptions::kv_standby_interval_ms)
      .def_property(
          "pd_role",
          [](const StageNodeOptions& o) { return std::string(pp::PdRoleName(o.pd_role)); },
          [](StageNodeOptions& o, const std::string& role) {
            o.pd_role = ValueOrThrow(pp::ParsePdRole(role, "pd_role"));
          },
          "Prefill-decode role: 'none', 'frontend', 'prefill' or 'decode' (docs/design/pd.md).")
      .def_readwrite("pd_retain_ms", &StageNodeOptions::pd_retain_ms)
      .def_readwrite("pd_retain_bytes", &StageNodeOptions::pd_retain_bytes)
      .def_readwrite("pd_handoff_wait_ms", &StageNodeOptions::pd_handoff_wait_ms)
      .def(
          "from_env",
          [](const StageNodeOptions& self) {
            return ValueOrThrow(StageNodeOptions::FromEnv(self));
          },
          "A copy with the CONNEX_PP_* variables applied (connex.InvalidArgument names a bad "
          "one).")
      .def(
          "validate", [](const StageNodeOptions& self) { ThrowIfError(self.Validate()); },
          "connex.InvalidArgument naming the first setting that cannot work.")
      .def("__repr__", [](const StageNodeOptions& o) {
        return StrCat("StageNodeOptions(model='", o.model, "', stage=", o.stage,
                      ", stages=", o.stages, ", replica=", o.replica, ", inflight=", o.inflight,
                      ")");
      });

  py::class_<PyStageNode>(
      m, "StageNode",
      "One pipeline stage endpoint of the step protocol (connex/pp/node.h), running a Python "
      "engine (connex.pp.Engine). It joins the directory as (model, stage, 0, replica), pulls "
      "each step's tensors with one one-sided read, runs the engine at most once per step, and "
      "forwards the output. Stage 0 is the owner of the requests submitted to it: it schedules "
      "steps, routes them through the other stages' replicas from the directory, and fails over "
      "(re-sends, re-prefills) when a stage dies. The engine runs on the node's loop thread with "
      "the GIL; completions and tokens are delivered on the node's callback thread. Thread-safe; "
      "every blocking call releases the GIL.")
      .def(py::init([](PyDirectoryClient& directory, py::object engine,
                       std::optional<StageNodeOptions> options, py::object transport,
                       const std::string& signal_host, py::kwargs kwargs) {
             if (options && kwargs.size() > 0) {
               throw py::type_error("StageNode: pass options= or keyword settings, not both");
             }
             StageNodeOptions o = options ? *options : OptionsFromKwargs(kwargs);
             return std::make_unique<PyStageNode>(directory, engine, std::move(o), transport,
                                                  signal_host);
           }),
           py::arg("directory"), py::arg("engine"), py::arg("options") = py::none(), py::kw_only(),
           py::arg("transport") = py::none(), py::arg("signal_host") = "127.0.0.1",
           "Starts a stage: `directory` is a started DirectoryClient, `engine` implements "
           "connex.pp.Engine, `options` a StageNodeOptions (or its fields as keywords). "
           "transport: None (CONNEX_PP_BACKEND and CONNEX_TRANSPORT_*), a backend name ('tcp', "
           "'shm', 'ucx', 'auto'), or a connex.transport.TransferEngine created for the node's "
           "LID (e.g. connex.transport.from_python over a Python data plane). Signals use "
           "ZeroMQ on `signal_host`. connex.InvalidArgument for bad options, connex.Unavailable "
           "when the directory or a transport cannot be reached.")
      .def("submit", &PyStageNode::Submit, py::arg("request_id"), py::arg("prompt"),
           py::arg("max_new_tokens"), py::arg("done") = py::none(),
           py::arg("on_token") = py::none(), py::kw_only(), py::arg("timeout_ms") = 0,
           py::arg("sampling") = py::none(),
           "Owner (stage 0) only: generates up to `max_new_tokens` tokens after `prompt` (a list "
           "of ints). Returns a concurrent.futures.Future of the generated tokens (a list) or of "
           "the connex.Error that ended the request. done(result) and on_token(request_id, "
           "token) run on the node's callback thread, the tokens in order and before done. "
           "connex.Fenced on another stage or after stop; connex.InvalidArgument for an empty "
           "prompt, a duplicate id or a bad sampling.")
      .def("cancel", &PyStageNode::Cancel, py::arg("request_id"), py::arg("why") = "cancelled",
           "Owner only: ends a running request now: its future gets connex.Cancelled(why), and "
           "no on_token callback of it runs once cancel returns (also from within one). "
           "connex.NotFound when it is not running.")
      .def("stop", &PyStageNode::Stop, py::arg("leave") = false, py::arg("drain_timeout") = 10.0,
           "Stops the loop. With leave, first drains: LEFT in the directory, no new steps, "
           "in-flight ones finish (up to drain_timeout s). Without, it stops as a crash would.")
      .def(
          "migrate",
          [](PyStageNode& self, const std::string& signal_host) {
            auto node = self.Get();
            ThrowIfError(Blocking([&] {
              absl::StatusOr<std::unique_ptr<pp::SignalTransport>> signals =
                  pp::CreateZmqSignalTransport(signal_host, self.curve());
              if (!signals.ok()) return signals.status();
              return node->Migrate(*std::move(signals));
            }));
          },
          py::arg("signal_host") = "127.0.0.1",
          "Moves this endpoint's signals to a new address under the same LID (MIGRATED), with "
          "the CURVE keys it had; the engine's state stays.")
      .def(
          "health",
          [](PyStageNode& self) {
            auto node = self.Get();
            ThrowIfError(Blocking([&] { return node->health(); }));
          },
          "Returns while the node serves; connex.Fenced once it lost its LID.")
      .def_property_readonly("lid", [](PyStageNode& self) { return self.Get()->lid(); })
      .def_property_readonly("epoch", [](PyStageNode& self) { return self.Get()->epoch(); })
      .def_property_readonly(
          "stats",
          [](PyStageNode& self) {
            auto node = self.Get();
            StageNodeStats s = Blocking([&] { return node->stats(); });
            return StatsDict(s);
          },
          "Counters and gauges (a dict), published once per turn of the node's loop: wait for "
          "one with a deadline.")
      .def_property_readonly(
          "engine", [](PyStageNode& self) { return self.engine(); }, "The engine.")
      .def("close", &PyStageNode::Close,
           "Stops the node as a crash would (if not stopped) and releases it; unfinished "
           "requests' futures get connex.Cancelled.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyStageNode& self, py::args) { self.Close(); });
}

}  // namespace connex::python
