#include "connex/engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/half.h"
#include "connex/engine/internal/errors.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using Json = nlohmann::json;

using internal::Bad;

absl::StatusOr<uint64_t> Unsigned(const Json& j, std::string_view what) {
  if (!j.is_number_unsigned()) {
    return Bad(StrCat(what, " is not a non-negative integer: ", DumpJson(j).substr(0, 40)));
  }
  return j.get<uint64_t>();
}

absl::StatusOr<TensorInfo> ParseTensorInfo(const std::string& name, const Json& j,
                                           uint64_t data_size) {
  std::string where = StrCat("tensor '", name, "'");
  if (!j.is_object()) return Bad(StrCat(where, ": entry is not a JSON object"));
  TensorInfo info;
  auto dtype_it = j.find("dtype");
  if (dtype_it == j.end() || !dtype_it->is_string()) {
    return Bad(StrCat(where, ": field 'dtype' is missing or not a string"));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = ParseDType(dtype_name);
  if (!dtype) return Bad(StrCat(where, ": unsupported dtype '", dtype_name, "'"));
  info.dtype = *dtype;

  auto shape_it = j.find("shape");
  if (shape_it == j.end() || !shape_it->is_array()) {
    return Bad(StrCat(where, ": field 'shape' is missing or not an array"));
  }
  if (shape_it->size() > 8) return Bad(StrCat(where, ": shape has more than 8 dimensions"));
  for (const Json& d : *shape_it) {
    CONNEX_ASSIGN_OR_RETURN(uint64_t dim, Unsigned(d, StrCat(where, ": a dimension of 'shape'")));
    if (dim > static_cast<uint64_t>(INT64_MAX)) return Bad(StrCat(where, ": dimension too large"));
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  std::optional<uint64_t> bytes = pp::ByteSize(info.shape, info.dtype);
  if (!bytes) return Bad(StrCat(where, ": shape ", ShapeString(info.shape), " overflows"));
  uint64_t nbytes = *bytes;

  auto off_it = j.find("data_offsets");
  if (off_it == j.end() || !off_it->is_array() || off_it->size() != 2) {
    return Bad(StrCat(where, ": field 'data_offsets' is missing or not a [begin, end] pair"));
  }
  CONNEX_ASSIGN_OR_RETURN(info.begin, Unsigned((*off_it)[0], StrCat(where, ": data_offsets[0]")));
  CONNEX_ASSIGN_OR_RETURN(info.end, Unsigned((*off_it)[1], StrCat(where, ": data_offsets[1]")));
  if (info.begin > info.end) {
    return Bad(StrCat(where, ": data_offsets [", info.begin, ", ", info.end, "] are reversed"));
  }
  if (info.end > data_size) {
    return Bad(StrCat(where, ": data_offsets end ", info.end, " is beyond the data section (",
                      data_size, " bytes; file truncated?)"));
  }
  if (info.end - info.begin != nbytes) {
    return Bad(StrCat(where, ": data_offsets cover ", info.end - info.begin, " bytes but ",
                      DTypeName(info.dtype), " ", ShapeString(info.shape), " needs ", nbytes));
  }
  return info;
}

absl::StatusOr<SafetensorsHeader> ParseHeaderOrThrow(std::span<const uint8_t> file) {
  if (file.size() < 8) {
    return Bad(StrCat("file is ", file.size(), " bytes, too short for a safetensors header"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | file[i];
  if (header_size > kMaxSafetensorsHeader) {
    return Bad(
        StrCat("header length ", header_size, " exceeds the limit of ", kMaxSafetensorsHeader));
  }
  if (header_size > file.size() - 8) {
    return Bad(StrCat("header length ", header_size, " is beyond the end of the file (",
                      file.size(), " bytes; truncated?)"));
  }
  const char* begin = reinterpret_cast<const char*>(file.data() + 8);
  Json j = ParseJson(std::string_view(begin, header_size));
  if (j.is_discarded()) return Bad("header is not valid JSON");
  if (!j.is_object()) return Bad("header is not a JSON object");

  SafetensorsHeader header;
  header.data_offset = 8 + header_size;
  uint64_t data_size = file.size() - header.data_offset;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Bad("field '__metadata__' is not a JSON object");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) return Bad(StrCat("__metadata__ '", mkey, "' is not a string"));
        header.metadata[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    CONNEX_ASSIGN_OR_RETURN(TensorInfo info, ParseTensorInfo(key, value, data_size));
    header.tensors.emplace(key, std::move(info));
  }
  // The tensors tile the data section exactly, as the format requires: no overlap, no hole, no
  // byte after the last tensor (empty tensors aside). A header length that is off by a few bytes
  // passes every check above when the header ends in padding, and shifts every tensor; it shows
  // here as uncovered bytes at the end (or as a tensor beyond the data section).
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [name, info] : header.tensors) {
    if (info.end > info.begin) order.emplace_back(&name, &info);
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  uint64_t covered = 0;  // the data section is covered up to here
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorInfo& info = *order[i].second;
    if (info.begin < covered) {
      return Bad(StrCat("tensor '", *order[i].first, "': data_offsets overlap tensor '",
                        *order[i - 1].first, "'"));
    }
    if (info.begin > covered) {
      return Bad(StrCat("bytes [", covered, ", ", info.begin,
                        ") of the data section belong to no tensor (a hole before tensor '",
                        *order[i].first, "')"));
    }
    covered = info.end;
  }
  if (covered != data_size) {
    return Bad(StrCat("the data section is ", data_size, " bytes but the tensors cover ", covered,
                      ": ", data_size - covered,
                      " trailing bytes belong to no tensor (header length ", header_size,
                      " does not end where the data starts?)"));
  }
  return header;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> file) {
  try {
    return ParseHeaderOrThrow(file);
  } catch (const std::exception& e) {  // defensive: every access above is type-checked
    return Bad(StrCat("header: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat(path, ": not a regular file"));
  }
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(StrCat(path, ": mmap failed: ", std::strerror(err)));
    }
    file->base_ = static_cast<const uint8_t*>(p);
    file->mapped_ = true;
  }
  ::close(fd);
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(std::span<const uint8_t>(file->base_, file->size_));
  if (!header.ok()) return Annotate(header.status(), path);
  file->header_ = *std::move(header);
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(
    std::vector<uint8_t> bytes) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = "<memory>";
  file->owned_ = std::move(bytes);
  file->base_ = file->owned_.data();
  file->size_ = file->owned_.size();
  CONNEX_ASSIGN_OR_RETURN(file->header_, ParseSafetensorsHeader(file->owned_));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = header_.tensors.find(name);
  return it == header_.tensors.end() ? nullptr : &it->second;
}

absl::StatusOr<std::span<const uint8_t>> SafetensorsFile::RawBytes(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::InvalidArgumentError(StrCat(path_, ": tensor '", name, "' is missing"));
  }
  return std::span<const uint8_t>(base_ + header_.data_offset + info->begin,
                                  info->end - info->begin);
}

absl::StatusOr<SafetensorsFile::FloatTensor> SafetensorsFile::MappedFloat(
    std::string_view name, std::span<const int64_t> shape) const {
  CONNEX_ASSIGN_OR_RETURN(std::span<const uint8_t> raw, RawBytes(name));
  const TensorInfo& info = *Find(name);
  if (!std::equal(info.shape.begin(), info.shape.end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(StrCat(path_, ": tensor '", name, "' has shape ",
                                             ShapeString(info.shape), ", expected ",
                                             ShapeString(shape)));
  }
  if (info.dtype != DType::kF32 && info.dtype != DType::kF16 && info.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(StrCat(path_, ": tensor '", name, "' has dtype ",
                                             DTypeName(info.dtype), ", expected F32, F16 or BF16"));
  }
  return FloatTensor{info.dtype, raw, mapped_};
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(std::string_view name,
                                                            std::span<const int64_t> shape) const {
  CONNEX_ASSIGN_OR_RETURN(FloatTensor t, MappedFloat(name, shape));
  const std::span<const uint8_t> raw = t.bytes;
  size_t n = raw.size() / DTypeSize(t.dtype);
  std::vector<float> out(n);
  if (t.dtype == DType::kF32) {
    if (n > 0) std::memcpy(out.data(), raw.data(), n * sizeof(float));
    return out;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = static_cast<uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8));
    out[i] = t.dtype == DType::kF16 ? F16ToFloat(h) : BF16ToFloat(h);
  }
  return out;
}

absl::StatusOr<Tensor> SafetensorsFile::ReadTensor(std::string_view name) const {
  CONNEX_ASSIGN_OR_RETURN(std::span<const uint8_t> raw, RawBytes(name));
  const TensorInfo& info = *Find(name);
  Tensor t;
  t.dtype = info.dtype;
  t.shape = info.shape;
  t.data.assign(raw.begin(), raw.end());
  return t;
}

std::vector<uint8_t> SerializeSafetensors(
    const TensorDict& tensors, const std::map<std::string, std::string, std::less<>>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors.tensors()) {
    header[name] = {{"dtype", std::string(DTypeName(t.dtype))},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = DumpJson(header);
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8 + text.size() + offset);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* data = out.data() + 8 + text.size();
  for (const auto& [name, t] : tensors.tensors()) {
    if (!t.data.empty()) std::memcpy(data, t.data.data(), t.data.size());
    data += t.data.size();
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const TensorDict& tensors,
                              const std::map<std::string, std::string, std::less<>>& metadata) {
  std::vector<uint8_t> bytes = SerializeSafetensors(tensors, metadata);
  std::string tmp = StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(StrCat(path, ": cannot create ", tmp));
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      ::unlink(tmp.c_str());
      return absl::ResourceExhaustedError(
          StrCat(path, ": writing ", bytes.size(), " bytes failed"));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::Status(absl::ErrnoToStatusCode(err),
                        StrCat(path, ": rename failed: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

Tensor ConvertF32(const Tensor& tensor, DType to) {
  if (tensor.dtype != DType::kF32 || to == DType::kF32) return tensor;
  Tensor out;
  out.dtype = to;
  out.shape = tensor.shape;
  std::span<const float> in = tensor.values<float>();
  out.data.resize(in.size() * 2);
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t h = to == DType::kF16 ? FloatToF16(in[i]) : FloatToBF16(in[i]);
    out.data[2 * i] = static_cast<uint8_t>(h);
    out.data[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return out;
}

}  // namespace connex::engine
