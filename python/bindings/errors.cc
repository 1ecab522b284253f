// absl::Status codes as Python exceptions: connex.Error and one subclass per code the library
// returns. Each carries `code` (the absl code's name) and the C++ message as its text.
#include <map>

#include "connex/base/strings.h"
#include "python/bindings/common.h"

namespace connex::python {
namespace {

// Guarded by the GIL; the module keeps the classes alive.
std::map<absl::StatusCode, PyObject*>& Classes() {
  static auto* classes = new std::map<absl::StatusCode, PyObject*>();
  return *classes;
}
PyObject* base_error = nullptr;

PyObject* NewException(py::module_& m, const char* name, const char* doc, py::object bases) {
  std::string qualified = std::string("connex.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

}  // namespace

void RegisterErrors(py::module_& m) {
  base_error = NewException(
      m, "Error",
      "Base of every error the Connex core reports. `code` is the absl status code's name "
      "(e.g. 'UNAVAILABLE'); str(error) is the C++ message, which names the culprit.",
      py::reinterpret_borrow<py::object>(PyExc_Exception));
  py::object base = py::reinterpret_borrow<py::object>(base_error);
  auto add = [&](absl::StatusCode code, const char* name, const char* doc, PyObject* extra) {
    py::object bases = extra ? py::object(py::make_tuple(base, py::handle(extra)))
                             : py::object(py::make_tuple(base));
    Classes()[code] = NewException(m, name, doc, bases);
  };
  add(absl::StatusCode::kUnavailable, "Unavailable",
      "UNAVAILABLE: the peer or the directory is gone or unreachable; retry on another peer.",
      PyExc_ConnectionError);
  add(absl::StatusCode::kFailedPrecondition, "Fenced",
      "FAILED_PRECONDITION: the incarnation is fenced (its epoch was superseded or evicted), the "
      "caller is not a member, or the object is in the wrong state; do not retry as is.",
      nullptr);
  add(absl::StatusCode::kNotFound, "NotFound", "NOT_FOUND: no such LID or registration.",
      PyExc_LookupError);
  add(absl::StatusCode::kInvalidArgument, "InvalidArgument",
      "INVALID_ARGUMENT: bad input; the message names what was wrong.", PyExc_ValueError);
  add(absl::StatusCode::kAlreadyExists, "AlreadyExists",
      "ALREADY_EXISTS: another live holder has the LID.", nullptr);
  add(absl::StatusCode::kPermissionDenied, "PermissionDenied",
      "PERMISSION_DENIED: a token or CURVE key is missing or wrong.", PyExc_PermissionError);
  add(absl::StatusCode::kDeadlineExceeded, "DeadlineExceeded",
      "DEADLINE_EXCEEDED: no answer in time.", PyExc_TimeoutError);
  add(absl::StatusCode::kAborted, "Aborted", "ABORTED: restart the operation.", nullptr);
  add(absl::StatusCode::kResourceExhausted, "ResourceExhausted",
      "RESOURCE_EXHAUSTED: a limit was reached (records, queue, bytes).", nullptr);
  add(absl::StatusCode::kCancelled, "Cancelled", "CANCELLED: the operation was cancelled.",
      nullptr);
  add(absl::StatusCode::kDataLoss, "DataLoss", "DATA_LOSS: corrupt data (a state file, a frame).",
      nullptr);
  add(absl::StatusCode::kInternal, "Internal", "INTERNAL: a broken invariant (a bug).", nullptr);
  m.def(
      "_raise_status",
      [](int code, const std::string& message) {
        RaiseStatus(absl::Status(static_cast<absl::StatusCode>(code), message));
      },
      "Raises the exception of an absl status code (for tests).");
}

py::object StatusToException(const absl::Status& status) {
  auto it = Classes().find(status.code());
  PyObject* cls = it == Classes().end() ? base_error : it->second;
  py::object error =
      py::reinterpret_borrow<py::object>(cls)(py::str(std::string(status.message())));
  error.attr("code") = py::str(absl::StatusCodeToString(status.code()));
  return error;
}

void RaiseStatus(const absl::Status& status) {
  py::object error = StatusToException(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

absl::Status StatusFromPython(const py::error_already_set& e, absl::StatusCode fallback,
                              std::string_view what) {
  absl::StatusCode code = fallback;
  for (const auto& [c, cls] : Classes()) {
    if (e.matches(cls)) {
      code = c;
      break;
    }
  }
  std::string type = py::str(e.type().attr("__name__"));
  std::string text = py::str(e.value());
  return absl::Status(code, StrCat(what, ": ", type, text.empty() ? "" : ": ", text));
}

}  // namespace connex::python
