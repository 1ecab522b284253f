#include "connex/engine/checkpoint.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using Json = nlohmann::json;

bool Exists(const std::string& path, bool directory) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && (directory ? S_ISDIR(st.st_mode) : true);
}

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The index's weight_map: tensor name -> shard file name (beside the index, no directories).
absl::StatusOr<std::map<std::string, std::string, std::less<>>> ReadIndex(const std::string& path,
                                                                          const std::string& dir) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  Json j = ParseJson(s);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(StrCat(path, ": not a JSON object"));
  }
  auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object() || map->empty()) {
    return absl::InvalidArgumentError(StrCat(path, ": 'weight_map' is missing or empty"));
  }
  std::map<std::string, std::string, std::less<>> index;
  std::set<std::string> files;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          StrCat(path, ": weight_map['", name, "'] is not a file name"));
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return absl::InvalidArgumentError(StrCat(path, ": weight_map['", name, "'] = \"", f,
                                               "\" is not a file name beside the index"));
    }
    if (files.insert(f).second && !Exists(StrCat(dir, "/", f), false)) {
      return absl::NotFoundError(
          StrCat(path, ": shard \"", f, "\" (of tensor '", name, "') does not exist"));
    }
    index.emplace(name, f);
  }
  return index;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("model path is empty");
  auto c = std::unique_ptr<Checkpoint>(new Checkpoint());
  if (!Exists(path, true)) {
    c->directory_ = Dirname(path);
    c->single_ = path;
  } else {
    c->directory_ = path;
    const std::string index = StrCat(path, "/", kIndexFile);
    if (Exists(index, false)) {
      CONNEX_ASSIGN_OR_RETURN(c->index_, ReadIndex(index, path));
    } else {
      c->single_ = StrCat(path, "/", kSingleFile);
      if (!Exists(c->single_, false)) {
        return absl::NotFoundError(
            StrCat(path, ": neither ", kIndexFile, " nor ", kSingleFile, " is there"));
      }
    }
  }
  if (!c->single_.empty()) CONNEX_RETURN_IF_ERROR(c->Shard(c->single_).status());
  return c;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::Shard(const std::string& file) const {
  connex::MutexLock lock(&mu_);
  auto it = open_.find(file);
  if (it == open_.end()) {
    const std::string path = single_.empty() ? StrCat(directory_, "/", file) : file;
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(path));
    it = open_.emplace(file, std::move(f)).first;
  }
  return it->second.get();
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::ShardOf(std::string_view name) const {
  if (!sharded()) return Shard(single_);
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::InvalidArgumentError(
        StrCat(directory_, "/", kIndexFile, ": tensor '", name, "' is missing"));
  }
  CONNEX_ASSIGN_OR_RETURN(const SafetensorsFile* shard, Shard(it->second));
  if (shard->Find(name) == nullptr) {
    return absl::InvalidArgumentError(StrCat(directory_, "/", it->second, ": tensor '", name,
                                             "' is missing (", kIndexFile, " puts it there)"));
  }
  return shard;
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  absl::StatusOr<const SafetensorsFile*> shard = ShardOf(name);
  return shard.ok() ? (*shard)->Find(name) : nullptr;
}

bool Checkpoint::Contains(std::string_view name) const {
  return sharded() ? index_.contains(name) : Find(name) != nullptr;
}

absl::StatusOr<std::span<const uint8_t>> Checkpoint::RawBytes(std::string_view name) const {
  CONNEX_ASSIGN_OR_RETURN(const SafetensorsFile* shard, ShardOf(name));
  return shard->RawBytes(name);
}

absl::StatusOr<std::vector<float>> Checkpoint::ReadF32(std::string_view name,
                                                       std::span<const int64_t> shape) const {
  CONNEX_ASSIGN_OR_RETURN(const SafetensorsFile* shard, ShardOf(name));
  return shard->ReadF32(name, shape);
}

absl::StatusOr<SafetensorsFile::FloatTensor> Checkpoint::MappedFloat(
    std::string_view name, std::span<const int64_t> shape) const {
  CONNEX_ASSIGN_OR_RETURN(const SafetensorsFile* shard, ShardOf(name));
  return shard->MappedFloat(name, shape);
}

std::vector<std::string> Checkpoint::shard_names() const {
  if (!sharded()) return {single_};
  std::set<std::string> files;
  for (const auto& [name, file] : index_) files.insert(file);
  return {files.begin(), files.end()};
}

std::vector<std::string> Checkpoint::OpenedShards() const {
  connex::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [file, f] : open_) out.push_back(file);
  return out;
}

const std::map<std::string, std::string, std::less<>>& Checkpoint::metadata() const {
  static const std::map<std::string, std::string, std::less<>> kEmpty;
  if (sharded()) return kEmpty;
  absl::StatusOr<const SafetensorsFile*> f = Shard(single_);
  return f.ok() ? (*f)->metadata() : kEmpty;
}

}  // namespace connex::engine
