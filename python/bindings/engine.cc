// connex.StageEngine: the reference engine (connex/engine) from Python — a checkpoint (a Hugging
// Face model directory as published, or a connex-mkmodel .safetensors file) loaded as one stage
// of a pipeline. It implements connex.pp.Engine on dicts of numpy arrays (execute_step and the
// rest, for a step by hand), and a connex.pp.StageNode given one runs it natively: no Python in
// a step's path. Once a node runs it, the node's loop is its only caller (the engine is
// thread-compatible): calls from Python then raise.
#include "python/bindings/engine.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "connex/engine/stage_engine.h"
#include "connex/engine/thread_pool.h"
#include "python/bindings/pp.h"

namespace connex::python {

PyStageEngine::PyStageEngine(std::unique_ptr<engine::StageEngine> engine)
    : engine_(std::move(engine)) {}

std::shared_ptr<PyStageEngine> PyStageEngine::Load(const std::string& path, int stage, int stages,
                                                   int threads) {
  engine::StageOptions options;
  options.stage = stage;
  options.stages = stages;
  if (threads < 0) {
    RaiseStatus(absl::InvalidArgumentError(StrCat("threads must be 0 or more, got ", threads)));
  }
  if (threads > 0) options.pool = std::make_shared<engine::ThreadPool>(threads);
  std::unique_ptr<engine::StageEngine> e =
      ValueOrThrow(Blocking([&] { return engine::StageEngine::Load(path, options); }));
  return std::shared_ptr<PyStageEngine>(new PyStageEngine(std::move(e)));
}

pp::Engine& PyStageEngine::TakeForNode() {
  if (in_node_) {
    RaiseStatus(absl::FailedPreconditionError(
        "StageEngine: a StageNode runs it already (one node per engine)"));
  }
  in_node_ = true;
  return *engine_;
}

engine::StageEngine& PyStageEngine::Direct(const char* what) {
  if (in_node_) {
    RaiseStatus(absl::FailedPreconditionError(StrCat(
        "StageEngine.", what, ": a StageNode runs this engine (its loop is its only caller)")));
  }
  return *engine_;
}

py::dict PyStageEngine::Config() const {
  const engine::ModelConfig& c = engine_->config();
  py::dict d;
  d["model_type"] = c.model_type;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["num_hidden_layers"] = c.num_hidden_layers;
  d["num_attention_heads"] = c.num_attention_heads;
  d["num_key_value_heads"] = c.num_key_value_heads;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["bos_token_id"] = c.bos_token_id < 0 ? py::object(py::none()) : py::int_(c.bos_token_id);
  d["eos_token_ids"] = c.eos_token_ids;
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  return d;
}

namespace {

pp::TensorDict StepOf(py::handle step, const char* what) {
  return ValueOrThrow(FromNumpyDict(step, StrCat("StageEngine.", what)));
}

}  // namespace

void RegisterEngine(py::module_& m) {
  py::class_<PyStageEngine, std::shared_ptr<PyStageEngine>>(m, "StageEngine")
      .def_static("load", &PyStageEngine::Load, py::arg("path"), py::kw_only(),
                  py::arg("stage") = 0, py::arg("stages") = 1, py::arg("threads") = 0)
      .def_property_readonly("stage", [](const PyStageEngine& e) { return e.engine().stage(); })
      .def_property_readonly("stages", [](const PyStageEngine& e) { return e.engine().stages(); })
      .def_property_readonly("config", &PyStageEngine::Config)
      .def("execute_step",
           [](PyStageEngine& self, py::handle step) {
             pp::TensorDict in = StepOf(step, "execute_step");
             engine::StageEngine& e = self.Direct("execute_step");
             pp::TensorDict out = ValueOrThrow(Blocking([&] { return e.ExecuteStep(in); }));
             return ValueOrThrow(ToNumpyDict(out));
           })
      .def("missing_requests",
           [](PyStageEngine& self, py::handle step) {
             pp::TensorDict in = StepOf(step, "missing_requests");
             return self.Direct("missing_requests").MissingRequests(in);
           })
      .def("holds_request",
           [](PyStageEngine& self, uint64_t id) {
             return self.Direct("holds_request").HoldsRequest(id);
           })
      .def("release", [](PyStageEngine& self, uint64_t id) { self.Direct("release").Release(id); })
      .def("num_held_requests",
           [](PyStageEngine& self) { return self.Direct("num_held_requests").NumHeldRequests(); })
      .def("output_bytes_per_token",
           [](PyStageEngine& self) {
             return self.Direct("output_bytes_per_token").OutputBytesPerToken();
           })
      .def("__repr__", [](const PyStageEngine& e) {
        const engine::ModelConfig& c = e.engine().config();
        return StrCat("StageEngine(", c.model_type, ", stage ", e.engine().stage(), " of ",
                      e.engine().stages(), ", ", c.num_hidden_layers, " layers, vocabulary ",
                      c.vocab_size, ")");
      });
}

}  // namespace connex::python
