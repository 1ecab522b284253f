// The Python wrapper of a TransferEngine (transport.cc), shared with the elastic bindings.
#ifndef CONNEX_PYTHON_BINDINGS_TRANSPORT_H_
#define CONNEX_PYTHON_BINDINGS_TRANSPORT_H_

#include <map>
#include <memory>

#include "connex/transport/transfer_engine.h"
#include "python/bindings/common.h"

namespace connex::python {

// A C++ engine with the Python buffers registered with it. The buffers are released only after
// the engine is destroyed (no read can then use them); the engine is destroyed without the GIL.
// Python state is guarded by the GIL.
struct EngineState {
  struct Registration {
    Py_buffer view;  // held (exported) while registered: the object can neither go nor resize
    size_t length = 0;
    bool writable = true;
  };
  transport::TransferEnginePtr engine;
  Lid lid;
  std::map<uintptr_t, Registration> registrations;
  ~EngineState();
};

class PyTransferEngine {
 public:
  PyTransferEngine(transport::TransferEnginePtr engine, Lid lid);
  ~PyTransferEngine();
  void Close();
  // The live state; RuntimeError once closed.
  std::shared_ptr<EngineState> Get() const;

  uint64_t SubscribePeerEvents(py::function callback);
  void UnsubscribePeerEvents(uint64_t id);

 private:
  std::shared_ptr<EngineState> state_;
  std::map<uint64_t, CallbackSlotPtr> subscriptions_;
  const DispatcherPtr dispatcher_ = Dispatcher::Create();
  uint64_t closer_ = 0;
};

}  // namespace connex::python

#endif  // CONNEX_PYTHON_BINDINGS_TRANSPORT_H_
