// What the step protocol's bindings (pp.cc) share with the Python data plane
// (python_transfer.cc): the C++ engine-contract adapter over a Python object, and the tensor dict
// conversions to and from numpy arrays.
#ifndef CONNEX_PYTHON_BINDINGS_PP_H_
#define CONNEX_PYTHON_BINDINGS_PP_H_

#include <pybind11/numpy.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "connex/base/strings.h"
#include "connex/pp/engine.h"
#include "connex/pp/tensor_dict.h"
#include "connex/transport/transfer_engine.h"
#include "python/bindings/common.h"
#include "python/bindings/transport.h"

namespace connex::python {

// A dict {name: numpy array} with a copy of every tensor of `dict` (the GIL must be held).
// InvalidArgument for a BF16 tensor (numpy has no bfloat16).
absl::StatusOr<py::dict> ToNumpyDict(const pp::TensorDict& dict);
// The tensors of a mapping {str: array-like} (float32, float16, int32, int64; made C-contiguous,
// copied). InvalidArgument names the key or dtype that is wrong; `what` prefixes the message.
absl::StatusOr<pp::TensorDict> FromNumpyDict(py::handle mapping, std::string_view what);

// Runs `fn` (returning a Status or StatusOr) with the GIL on a C++ thread, unless the interpreter
// is shutting down (Unavailable then).
template <typename F>
auto WithGil(const char* what, F&& fn) -> decltype(fn()) {
  if (Finalizing()) {
    return absl::UnavailableError(
        StrCat("python engine: ", what, ": the interpreter is shutting down"));
  }
  py::gil_scoped_acquire gil;
  return fn();
}

// pp::Engine over a Python object with execute_step, holds_request, release, num_held_requests
// and optionally missing_requests, output_bytes_per_token and the request state as data
// (exports_state, held_positions, export_state, import_state, drop_state; pp_state.cc): without
// them, or when exports_state() is false, the contract's defaults (connex.pp.Engine). Every call
// takes the GIL on the calling thread (the node's loop thread: a Python engine's step is Python
// code). After the interpreter began to shut down it calls nothing and fails steps with
// Unavailable. Thread-compatible, as the contract requires.
class PythonEngine final : public pp::Engine {
 public:
  // GIL held. TypeError naming a missing method.
  explicit PythonEngine(py::object engine);
  ~PythonEngine() override;

  absl::StatusOr<pp::TensorDict> ExecuteStep(const pp::TensorDict& in) override;
  std::vector<uint64_t> MissingRequests(const pp::TensorDict& in) const override;
  bool HoldsRequest(uint64_t request_id) const override;
  void Release(uint64_t request_id) override;
  size_t NumHeldRequests() const override;
  uint64_t OutputBytesPerToken() const override { return bytes_per_token_; }

  // The request state as data (pp_state.cc). exports_state() is read once, at construction. The
  // engine's exceptions become statuses: a connex.Error keeps its code, IndexError is
  // OutOfRange, NotImplementedError Unimplemented, anything else Internal.
  bool ExportsState() const override { return exports_state_; }
  int64_t HeldPositions(uint64_t request_id) const override;
  absl::StatusOr<pp::TensorDict> ExportState(uint64_t request_id, int64_t from,
                                             int64_t to) const override;
  absl::Status ImportState(uint64_t request_id, int64_t from, const pp::TensorDict& state) override;
  absl::Status DropState(uint64_t request_id, int64_t from) override;

  py::object object() const { return py::reinterpret_borrow<py::object>(engine_); }

 private:
  // GIL held; may throw (ExecuteStep turns what it throws into a status).
  absl::StatusOr<pp::TensorDict> ExecuteStepLocked(const pp::TensorDict& in);

  // GIL held: whether `engine` exports state (its exports_state(), when it has one). TypeError
  // naming a method of the three that it lacks when it says it does.
  static bool ReadExportsState(const py::object& engine);

  PyObject* engine_;  // owned reference
  uint64_t bytes_per_token_ = 0;
  bool exports_state_ = false;
};

// A TransferEngine that forwards to a shared one (a connex.transport.TransferEngine's), so that
// a StageNode can use an engine that Python code also holds.
transport::TransferEnginePtr ShareTransferEngine(std::shared_ptr<EngineState> state);

}  // namespace connex::python

#endif  // CONNEX_PYTHON_BINDINGS_PP_H_
