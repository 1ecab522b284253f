#include "connex/pp/tensor_dict.h"

#include "absl/status/status.h"
#include "connex/base/strings.h"

namespace connex::pp {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 1;
}

std::optional<int64_t> NumElements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > INT64_MAX / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::optional<uint64_t> ByteSize(std::span<const int64_t> shape, DType dtype) {
  std::optional<int64_t> n = NumElements(shape);
  if (!n || static_cast<uint64_t>(*n) > UINT64_MAX / DTypeSize(dtype)) return std::nullopt;
  return static_cast<uint64_t>(*n) * DTypeSize(dtype);
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += StrCat(i ? ", " : "", shape[i]);
  return out + "]";
}

const Tensor* TensorDict::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Tensor* TensorDict::FindMutable(std::string_view name) {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void TensorDict::Erase(std::string_view name) {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) tensors_.erase(it);
}

absl::StatusOr<const Tensor*> TensorDict::Get(std::string_view name, DType dtype, int rank) const {
  const Tensor* t = Find(name);
  if (t == nullptr) return absl::InvalidArgumentError(StrCat("tensor '", name, "' is missing"));
  if (t->dtype != dtype) {
    return absl::InvalidArgumentError(StrCat("tensor '", name, "' has dtype ", DTypeName(t->dtype),
                                             ", expected ", DTypeName(dtype)));
  }
  if (rank >= 0 && static_cast<int>(t->shape.size()) != rank) {
    return absl::InvalidArgumentError(
        StrCat("tensor '", name, "' has shape ", ShapeString(t->shape), ", expected rank ", rank));
  }
  std::optional<uint64_t> bytes = ByteSize(t->shape, dtype);
  if (!bytes || *bytes != t->data.size()) {
    return absl::InvalidArgumentError(StrCat("tensor '", name, "': shape ", ShapeString(t->shape),
                                             " does not match its ", t->data.size(), " bytes"));
  }
  return t;
}

bool TensorDict::operator==(const TensorDict& other) const { return tensors_ == other.tensors_; }

namespace {
constexpr uint64_t kAlign = 64;
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

uint64_t PackedSize(const TensorDict& dict) {
  uint64_t size = 0;
  for (const auto& [name, t] : dict.tensors()) size = AlignUp(size) + t.data.size();
  return size;
}

std::vector<TensorLayout> Pack(const TensorDict& dict, uint8_t* out) {
  std::vector<TensorLayout> layout;
  uint64_t offset = 0;
  for (const auto& [name, t] : dict.tensors()) {
    offset = AlignUp(offset);
    if (!t.data.empty()) std::memcpy(out + offset, t.data.data(), t.data.size());
    layout.push_back(TensorLayout{name, t.dtype, t.shape, offset, t.data.size()});
    offset += t.data.size();
  }
  return layout;
}

absl::StatusOr<TensorDict> Unpack(const std::vector<TensorLayout>& layout, const uint8_t* buffer,
                                  uint64_t length) {
  TensorDict dict;
  for (const TensorLayout& l : layout) {
    if (l.offset > length || l.size > length - l.offset) {
      return absl::InvalidArgumentError(StrCat("tensor '", l.name, "' at [", l.offset, ", +",
                                               l.size, ") is outside the ", length,
                                               "-byte payload"));
    }
    std::optional<uint64_t> bytes = ByteSize(l.shape, l.dtype);
    if (!bytes || *bytes != l.size) {
      return absl::InvalidArgumentError(StrCat("tensor '", l.name, "': shape ",
                                               ShapeString(l.shape), " does not match ", l.size,
                                               " bytes of ", DTypeName(l.dtype)));
    }
    if (dict.Contains(l.name)) {
      return absl::InvalidArgumentError(StrCat("tensor '", l.name, "' appears twice"));
    }
    Tensor t;
    t.dtype = l.dtype;
    t.shape = l.shape;
    t.data.assign(buffer + l.offset, buffer + l.offset + l.size);
    dict.Set(l.name, std::move(t));
  }
  return dict;
}

}  // namespace connex::pp
