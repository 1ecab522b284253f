// TensorDict: named tensors (dtype, shape, bytes) — what crosses pipeline stages at a step
// boundary (the engine contract, connex/pp/engine.h) and what a checkpoint holds. Also its
// packing into one contiguous buffer (a send-ring slot) and back, described by a layout that
// travels in the step signal. Thread-compatible (value types).
#ifndef CONNEX_PP_TENSOR_DICT_H_
#define CONNEX_PP_TENSOR_DICT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::pp {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64 };

// "F32", "F16", "BF16", "I32", "I64" (the safetensors spelling).
std::string_view DTypeName(DType dtype);
std::optional<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType dtype);

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}

// Product of `shape`, or nullopt when a dimension is negative or the product overflows int64.
std::optional<int64_t> NumElements(std::span<const int64_t> shape);
// Bytes of a `dtype` tensor of `shape`, or nullopt when a dimension is negative or the size
// overflows (`[2^31, 2^31]` F32 is 2^64 bytes, not 0).
std::optional<uint64_t> ByteSize(std::span<const int64_t> shape, DType dtype);

// "[2, 3]".
std::string ShapeString(std::span<const int64_t> shape);

// A dense row-major tensor that owns its bytes. The buffer is allocated by operator new, so it is
// aligned for every dtype above.
struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t num_elements() const { return static_cast<int64_t>(data.size() / DTypeSize(dtype)); }

  // Typed views; the caller must have checked dtype (see TensorDict::Get).
  template <typename T>
  std::span<const T> values() const {
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
  template <typename T>
  std::span<T> mutable_values() {
    return {reinterpret_cast<T*>(data.data()), data.size() / sizeof(T)};
  }

  template <typename T>
  static Tensor Of(std::vector<int64_t> shape, std::span<const T> values) {
    Tensor t;
    t.dtype = DTypeOf<T>();
    t.shape = std::move(shape);
    t.data.resize(values.size_bytes());
    if (!values.empty()) std::memcpy(t.data.data(), values.data(), values.size_bytes());
    return t;
  }
  template <typename T>
  static Tensor Zeros(std::vector<int64_t> shape) {
    Tensor t;
    t.dtype = DTypeOf<T>();
    t.data.resize(static_cast<size_t>(NumElements(shape).value_or(0)) * sizeof(T));
    t.shape = std::move(shape);
    return t;
  }
};

// Named tensors, ordered by name (so that serialisation is deterministic).
class TensorDict {
 public:
  void Set(std::string name, Tensor tensor) { tensors_[std::move(name)] = std::move(tensor); }
  bool Contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  const Tensor* Find(std::string_view name) const;
  // The tensor `name` to change in place (its bytes and shape stay consistent: the caller's
  // job), or nullptr.
  Tensor* FindMutable(std::string_view name);
  void Erase(std::string_view name);

  // The tensor `name`, checked to have `dtype` and `rank` dimensions (rank -1: any).
  // InvalidArgument names the tensor and what was wrong.
  absl::StatusOr<const Tensor*> Get(std::string_view name, DType dtype, int rank = -1) const;

  const std::map<std::string, Tensor, std::less<>>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  bool operator==(const TensorDict& other) const;

 private:
  std::map<std::string, Tensor, std::less<>> tensors_;
};

inline bool operator==(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
}

// Where one tensor sits in a packed buffer.
struct TensorLayout {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the packed buffer, 64-byte aligned
  uint64_t size = 0;    // bytes
};

// Bytes needed to pack `dict` (with 64-byte alignment of every tensor).
uint64_t PackedSize(const TensorDict& dict);
// Packs `dict` into `out` (at least PackedSize bytes); returns the layout.
std::vector<TensorLayout> Pack(const TensorDict& dict, uint8_t* out);
// Rebuilds a dict from `buffer` of `length` bytes. InvalidArgument names a layout entry that is
// out of bounds, of an unknown dtype, or whose shape does not match its size.
absl::StatusOr<TensorDict> Unpack(const std::vector<TensorLayout>& layout, const uint8_t* buffer,
                                  uint64_t length);

}  // namespace connex::pp

#endif  // CONNEX_PP_TENSOR_DICT_H_
