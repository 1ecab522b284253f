// Reading and writing safetensors checkpoints (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
// byte range, then the raw little-endian data. The reader memory-maps the file and validates
// every header field before any tensor is touched, so that a corrupt, truncated or hostile file
// gives an InvalidArgument naming the tensor or field, never a crash (fuzz/safetensors_fuzz.cc).
// Thread contract: SafetensorsFile is immutable after Open and thread-safe; the functions are
// thread-safe.
#ifndef CONNEX_ENGINE_SAFETENSORS_H_
#define CONNEX_ENGINE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/engine/tensor_dict.h"

namespace connex::engine {

// Headers larger than this are rejected (the format's own reader uses the same limit).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

struct TensorInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range inside the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, std::string, std::less<>> metadata;  // "__metadata__"
  std::map<std::string, TensorInfo, std::less<>> tensors;
  uint64_t data_offset = 0;  // where the data section starts in the file
};

// Parses and validates the header of a safetensors file held in `file` (the whole file: the
// tensors' byte ranges are checked against its size). InvalidArgument on anything malformed.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> file);

// A validated, memory-mapped (read-only) safetensors file.
class SafetensorsFile {
 public:
  // Maps `path`. NotFound when it does not exist; InvalidArgument when it is not a valid
  // safetensors file (the message names the path and the culprit).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // A file held in memory (tests, the fuzzer).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::vector<uint8_t> bytes);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::map<std::string, std::string, std::less<>>& metadata() const {
    return header_.metadata;
  }
  const TensorInfo* Find(std::string_view name) const;

  // The raw bytes of tensor `name` (inside the mapping). InvalidArgument when absent.
  absl::StatusOr<std::span<const uint8_t>> RawBytes(std::string_view name) const;

  // Tensor `name` converted to fp32 (from F32, F16 or BF16), checked to have `shape`.
  // InvalidArgument names the tensor: absent, other dtype, other shape.
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name,
                                             std::span<const int64_t> shape) const;

  // Tensor `name` in place (zero copy, at any alignment: the format aligns nothing), checked as
  // ReadF32 checks it: F32, F16 or BF16, with `shape`. The bytes live as long as this file.
  struct FloatTensor {
    DType dtype;
    std::span<const uint8_t> bytes;
    bool mapped = false;  // the bytes are pages of a file mapping (Open), not memory (FromBytes)
  };
  absl::StatusOr<FloatTensor> MappedFloat(std::string_view name,
                                          std::span<const int64_t> shape) const;

  // Tensor `name` as a TensorDict entry (a copy, any dtype).
  absl::StatusOr<Tensor> ReadTensor(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
  SafetensorsHeader header_;
};

// Serialises `tensors` with `metadata` into safetensors bytes. The header is padded so that the
// data section starts 8-byte aligned, and each tensor starts at a multiple of its element size.
std::vector<uint8_t> SerializeSafetensors(
    const TensorDict& tensors, const std::map<std::string, std::string, std::less<>>& metadata);

// Writes SerializeSafetensors(...) to `path` (through a temporary file and a rename).
absl::Status WriteSafetensors(const std::string& path, const TensorDict& tensors,
                              const std::map<std::string, std::string, std::less<>>& metadata);

// Converts an F32 tensor to F16 or BF16 (rounding to nearest even), or returns it unchanged for
// F32.
Tensor ConvertF32(const Tensor& tensor, DType to);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_SAFETENSORS_H_
