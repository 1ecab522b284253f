// The versioned wire codec: every Connex control message (directory requests, replies and
// events; step signals) is one msgpack frame `[version, type, body]`, where body is a map with
// string keys. Decoding enforces size limits before and during unpacking, and every error names
// the field that was wrong (`JOIN.lid: expected string, found integer`). Builders and views are
// thread-compatible value types.
#ifndef CONNEX_BASE_CODEC_H_
#define CONNEX_BASE_CODEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "msgpack.hpp"

namespace connex::wire {

// Version this build writes; frames with versions in [kMinVersion, kVersion] are accepted.
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kMinVersion = 1;

struct Limits {
  size_t max_frame_bytes = 16 << 20;  // whole encoded frame
  size_t max_elements = 1 << 20;      // entries of any one array or map
  size_t max_string = 1 << 20;        // bytes of any one string
  size_t max_binary = 16 << 20;       // bytes of any one binary
  size_t max_depth = 16;              // nesting of arrays and maps
};

class ListBuilder;

// Accumulates the entries of one msgpack map.
class MapBuilder {
 public:
  MapBuilder() : packer_(buffer_) {}
  MapBuilder(const MapBuilder&) = delete;
  MapBuilder& operator=(const MapBuilder&) = delete;

  MapBuilder& Str(std::string_view key, std::string_view value);
  MapBuilder& Bin(std::string_view key, std::string_view bytes);
  MapBuilder& Uint(std::string_view key, uint64_t value);
  MapBuilder& Int(std::string_view key, int64_t value);
  MapBuilder& Bool(std::string_view key, bool value);
  MapBuilder& Double(std::string_view key, double value);
  MapBuilder& StrList(std::string_view key, const std::vector<std::string>& values);
  MapBuilder& UintList(std::string_view key, const std::vector<uint64_t>& values);
  MapBuilder& Map(std::string_view key, const MapBuilder& nested);
  MapBuilder& StrMap(std::string_view key, const std::map<std::string, std::string>& values);
  MapBuilder& List(std::string_view key, const ListBuilder& nested);
  // Appends every entry of `other` (already encoded: a cached part of a reply is copied, not
  // re-encoded). Keys must not repeat the ones already here.
  MapBuilder& Entries(const MapBuilder& other);

  size_t size() const { return entries_; }
  // Bytes of the encoded entries so far (without the map header).
  size_t encoded_bytes() const { return buffer_.size(); }
  // Appends the packed map (header + entries) to `out`.
  void AppendPacked(msgpack::sbuffer& out) const;

 private:
  void Key(std::string_view key);
  msgpack::sbuffer buffer_;
  msgpack::packer<msgpack::sbuffer> packer_;
  size_t entries_ = 0;
};

// Accumulates the elements of one msgpack array.
class ListBuilder {
 public:
  ListBuilder() : packer_(buffer_) {}
  ListBuilder(const ListBuilder&) = delete;
  ListBuilder& operator=(const ListBuilder&) = delete;

  ListBuilder& AddMap(const MapBuilder& map);
  ListBuilder& AddStr(std::string_view value);
  ListBuilder& AddUint(uint64_t value);

  size_t size() const { return entries_; }
  void AppendPacked(msgpack::sbuffer& out) const;

 private:
  msgpack::sbuffer buffer_;
  msgpack::packer<msgpack::sbuffer> packer_;
  size_t entries_ = 0;
};

// Encodes one frame `[kVersion, type, body]`.
std::string EncodeFrame(std::string_view type, const MapBuilder& body);

class ListView;

// A read-only view of a decoded msgpack map. Valid while the Frame it came from lives. `path`
// prefixes every error message.
class MapView {
 public:
  MapView() = default;
  static absl::StatusOr<MapView> Of(const msgpack::object& object, std::string path);

  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  size_t size() const { return object_ == nullptr ? 0 : object_->via.map.size; }
  const std::string& path() const { return path_; }

  // Required fields: NotFound is reported as InvalidArgument naming the field.
  absl::StatusOr<std::string> Str(std::string_view key) const;
  absl::StatusOr<std::string_view> Bin(std::string_view key) const;  // bin or str
  absl::StatusOr<uint64_t> Uint(std::string_view key) const;
  absl::StatusOr<int64_t> Int(std::string_view key) const;
  absl::StatusOr<bool> Bool(std::string_view key) const;
  absl::StatusOr<double> Double(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> StrList(std::string_view key) const;
  absl::StatusOr<std::vector<uint64_t>> UintList(std::string_view key) const;
  absl::StatusOr<MapView> Map(std::string_view key) const;
  // A free-form map of string to string (e.g. metadata).
  absl::StatusOr<std::map<std::string, std::string>> StrMap(std::string_view key) const;
  absl::StatusOr<ListView> List(std::string_view key) const;

  // Optional fields: the default when absent, an error when present with the wrong type.
  absl::StatusOr<std::string> StrOr(std::string_view key, std::string_view def) const;
  absl::StatusOr<uint64_t> UintOr(std::string_view key, uint64_t def) const;
  absl::StatusOr<bool> BoolOr(std::string_view key, bool def) const;

 private:
  const msgpack::object* Find(std::string_view key) const;
  absl::StatusOr<const msgpack::object*> Require(std::string_view key) const;
  std::string FieldPath(std::string_view key) const;

  const msgpack::object* object_ = nullptr;
  std::string path_;
};

// A read-only view of a decoded msgpack array.
class ListView {
 public:
  ListView() = default;
  static absl::StatusOr<ListView> Of(const msgpack::object& object, std::string path);

  size_t size() const { return object_ == nullptr ? 0 : object_->via.array.size; }
  absl::StatusOr<MapView> MapAt(size_t i) const;
  absl::StatusOr<std::string> StrAt(size_t i) const;
  absl::StatusOr<uint64_t> UintAt(size_t i) const;

 private:
  std::string ElementPath(size_t i) const;
  const msgpack::object* object_ = nullptr;
  std::string path_;
};

// A decoded frame. Owns the memory its views point into; move-only.
struct Frame {
  uint32_t version = 0;
  std::string type;
  MapView body;
  msgpack::object_handle handle;
};

// Decodes one frame. InvalidArgument (naming the problem) for anything malformed, oversized, of
// an unsupported version, or with trailing bytes.
absl::StatusOr<Frame> DecodeFrame(std::string_view bytes, const Limits& limits = Limits());

// Name of a msgpack type, for error messages ("string", "integer", ...).
std::string_view TypeName(const msgpack::object& object);

}  // namespace connex::wire

#endif  // CONNEX_BASE_CODEC_H_
