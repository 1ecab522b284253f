// A model's weights as Hugging Face publishes them: one safetensors file, or shards
// (model-00001-of-00004.safetensors, ...) named tensor by tensor in model.safetensors.index.json.
// A shard is opened — its header validated, the file memory-mapped — the first time one of its
// tensors is asked for, so a pipeline stage maps only the shards that hold its layers, and of
// those reads only its own tensors' pages. Thread-safe (shards are opened under a mutex; a
// tensor's bytes stay valid as long as the Checkpoint).
#ifndef CONNEX_ENGINE_CHECKPOINT_H_
#define CONNEX_ENGINE_CHECKPOINT_H_

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "connex/base/mutex.h"
#include "connex/engine/model_config.h"
#include "connex/engine/safetensors.h"

namespace connex::engine {

inline constexpr char kIndexFile[] = "model.safetensors.index.json";
inline constexpr char kSingleFile[] = "model.safetensors";

class Checkpoint {
 public:
  // `path` is a .safetensors file, or a directory holding model.safetensors.index.json (sharded;
  // it wins) or model.safetensors. The index is validated (shard names are plain file names
  // beside it, each shard exists); shards are not opened yet. NotFound: no checkpoint there;
  // InvalidArgument names the file and the culprit.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);

  // The tensor `name`'s header entry, opening its shard; nullptr when the checkpoint has no such
  // tensor or its shard cannot be opened (ReadF32 and RawBytes say why).
  const TensorInfo* Find(std::string_view name) const;
  bool Contains(std::string_view name) const;
  // The same as SafetensorsFile's, on the shard holding `name`; errors name the shard.
  absl::StatusOr<std::span<const uint8_t>> RawBytes(std::string_view name) const;
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name,
                                             std::span<const int64_t> shape) const;
  absl::StatusOr<SafetensorsFile::FloatTensor> MappedFloat(std::string_view name,
                                                           std::span<const int64_t> shape) const;

  // The directory the checkpoint is in (config.json lives there) and its weights' files.
  const std::string& directory() const { return directory_; }
  bool sharded() const { return !index_.empty(); }
  std::vector<std::string> shard_names() const;
  // The files opened (mapped) so far, in name order.
  std::vector<std::string> OpenedShards() const;
  // The single file's __metadata__ (empty when sharded): the connex-llama config form.
  const std::map<std::string, std::string, std::less<>>& metadata() const;

 private:
  Checkpoint() = default;
  // The open shard `file` (a name beside the index, or the single file's path).
  absl::StatusOr<const SafetensorsFile*> Shard(const std::string& file) const;
  absl::StatusOr<const SafetensorsFile*> ShardOf(std::string_view name) const;

  std::string directory_;
  std::string single_;                                     // the one file's path, when not sharded
  std::map<std::string, std::string, std::less<>> index_;  // tensor -> shard file name
  mutable connex::Mutex mu_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_CHECKPOINT_H_
