// connex.StageEngine (engine.cc): the reference engine's Python side, and what a StageNode
// (pp.cc) needs of it to run it natively.
#ifndef CONNEX_PYTHON_BINDINGS_ENGINE_H_
#define CONNEX_PYTHON_BINDINGS_ENGINE_H_

#include <memory>
#include <string>

#include "connex/engine/stage_engine.h"
#include "python/bindings/common.h"

namespace connex::python {

// Thread-compatible, as the engine: Python calls hold the GIL; a StageNode's loop is the only
// caller once it took the engine (TakeForNode).
class PyStageEngine {
 public:
  // Loads stage `stage` of `stages` of the checkpoint at `path` with `threads` kernel threads
  // (0: CONNEX_ENGINE_THREADS, or every core). Raises the load's error (NotFound, InvalidArgument
  // naming the field or tensor).
  static std::shared_ptr<PyStageEngine> Load(const std::string& path, int stage, int stages,
                                             int threads);

  // For a StageNode: the engine, once; raises FailedPrecondition the second time.
  pp::Engine& TakeForNode();
  // The engine for a direct call from Python; raises while a node runs it.
  engine::StageEngine& Direct(const char* what);
  const engine::StageEngine& engine() const { return *engine_; }
  py::dict Config() const;

 private:
  explicit PyStageEngine(std::unique_ptr<engine::StageEngine> engine);
  std::unique_ptr<engine::StageEngine> engine_;
  bool in_node_ = false;
};

void RegisterEngine(py::module_& m);

}  // namespace connex::python

#endif  // CONNEX_PYTHON_BINDINGS_ENGINE_H_
