// The name a checkpoint is served under by default: connex-stage's `--model-name` when none is
// given, and connex-chaos's for a deployment of a `--model` of its own.
#ifndef CONNEX_SERVING_MODEL_NAME_H_
#define CONNEX_SERVING_MODEL_NAME_H_

#include <string>

namespace connex::serving {

// The directory's name for a directory, the file's stem otherwise, or the parent directory's name
// for a file called model.safetensors ("/models/tiny-llama/model.safetensors" -> "tiny-llama").
// Made a valid LID model name (characters outside [A-Za-z0-9._-] become '-').
std::string ServedModelName(const std::string& model_path);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_MODEL_NAME_H_
