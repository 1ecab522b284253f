// The Python engine adapter's request state as data (pp::Engine's ExportsState, HeldPositions,
// ExportState, ImportState, DropState over a Python object's exports_state, held_positions,
// export_state, import_state and drop_state), and connex._connex._EngineAdapter, which drives a
// Python engine through the adapter so that tests see what the step protocol would.
#include <string>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "python/bindings/pp.h"

namespace connex::python {

using pp::TensorDict;

namespace {

constexpr const char* kStateMethods[] = {"held_positions", "export_state", "import_state",
                                         "drop_state"};

// The status of an exception a state call raised: a connex.Error keeps its code; IndexError
// (positions not held) is OutOfRange and NotImplementedError Unimplemented, as the contract's
// codes; anything else is Internal.
absl::Status StateCallStatus(const py::error_already_set& e, const char* method) {
  const std::string what = StrCat("python engine: ", method);
  absl::StatusCode fallback = absl::StatusCode::kInternal;
  if (e.matches(PyExc_IndexError)) fallback = absl::StatusCode::kOutOfRange;
  if (e.matches(PyExc_NotImplementedError)) fallback = absl::StatusCode::kUnimplemented;
  return StatusFromPython(e, fallback, what);
}

// Runs a state call with the GIL; nothing may escape to the node's thread.
template <typename F>
auto StateCall(const char* method, F&& fn) -> decltype(fn()) {
  return WithGil(method, [&]() -> decltype(fn()) {
    try {
      return fn();
    } catch (py::error_already_set& e) {
      return StateCallStatus(e, method);
    } catch (const std::exception& e) {
      return absl::InternalError(StrCat("python engine: ", method, ": ", e.what()));
    }
  });
}

}  // namespace

bool PythonEngine::ReadExportsState(const py::object& engine) {
  if (!py::hasattr(engine, "exports_state")) return false;
  if (!py::bool_(engine.attr("exports_state")())) return false;
  for (const char* method : kStateMethods) {
    if (!py::hasattr(engine, method)) {
      throw py::type_error(StrCat("StageNode: the engine (a ", TypeName(engine),
                                  ") says exports_state() but has no method ", method,
                                  " (see connex.pp.Engine)"));
    }
  }
  return true;
}

int64_t PythonEngine::HeldPositions(uint64_t request_id) const {
  if (!exports_state_ || Finalizing()) return 0;
  py::gil_scoped_acquire gil;
  try {
    return object().attr("held_positions")(request_id).cast<int64_t>();
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("connex python engine held_positions");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_TypeError,
                    StrCat("held_positions must return an int: ", e.what()).c_str());
    PyErr_WriteUnraisable(engine_);
  }
  return 0;
}

absl::StatusOr<TensorDict> PythonEngine::ExportState(uint64_t request_id, int64_t from,
                                                     int64_t to) const {
  if (!exports_state_) return pp::Engine::ExportState(request_id, from, to);
  return StateCall("export_state", [&]() -> absl::StatusOr<TensorDict> {
    py::object result = object().attr("export_state")(request_id, from, to);
    return FromNumpyDict(result, "python engine: export_state result");
  });
}

absl::Status PythonEngine::ImportState(uint64_t request_id, int64_t from, const TensorDict& state) {
  if (!exports_state_) return pp::Engine::ImportState(request_id, from, state);
  return StateCall("import_state", [&]() -> absl::Status {
    absl::StatusOr<py::dict> args = ToNumpyDict(state);
    if (!args.ok()) return Annotate(args.status(), "python engine: import_state");
    object().attr("import_state")(request_id, from, *args);
    return absl::OkStatus();
  });
}

absl::Status PythonEngine::DropState(uint64_t request_id, int64_t from) {
  if (!exports_state_) return pp::Engine::DropState(request_id, from);
  return StateCall("drop_state", [&]() -> absl::Status {
    object().attr("drop_state")(request_id, from);
    return absl::OkStatus();
  });
}

void RegisterPpState(py::module_& m) {
  // What the step protocol sees of a Python engine, for tests: every call goes through
  // PythonEngine (and the tensors through TensorDicts), errors come back as connex.Error.
  py::class_<PythonEngine>(m, "_EngineAdapter")
      .def(py::init([](py::object engine) { return std::make_unique<PythonEngine>(engine); }))
      .def("exports_state", &PythonEngine::ExportsState)
      .def("held_positions", &PythonEngine::HeldPositions)
      .def("holds_request", &PythonEngine::HoldsRequest)
      .def("num_held_requests", &PythonEngine::NumHeldRequests)
      .def("execute_step",
           [](PythonEngine& self, py::handle tensors) {
             TensorDict in = ValueOrThrow(FromNumpyDict(tensors, "execute_step"));
             return ValueOrThrow(ToNumpyDict(ValueOrThrow(self.ExecuteStep(in))));
           })
      .def("export_state",
           [](const PythonEngine& self, uint64_t id, int64_t from, int64_t to) {
             return ValueOrThrow(ToNumpyDict(ValueOrThrow(self.ExportState(id, from, to))));
           })
      .def("import_state",
           [](PythonEngine& self, uint64_t id, int64_t from, py::handle state) {
             TensorDict in = ValueOrThrow(FromNumpyDict(state, "import_state"));
             ThrowIfError(self.ImportState(id, from, in));
           })
      .def("drop_state", [](PythonEngine& self, uint64_t id, int64_t from) {
        ThrowIfError(self.DropState(id, from));
      });
}

}  // namespace connex::python
