#include "connex/base/codec.h"

#include <limits>
#include <utility>

#include "connex/base/strings.h"

namespace connex::wire {
namespace {

void PackStr(msgpack::packer<msgpack::sbuffer>& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

absl::Status WrongType(const std::string& path, std::string_view expected,
                       const msgpack::object& found) {
  return absl::InvalidArgumentError(
      StrCat(path, ": expected ", expected, ", found ", TypeName(found)));
}

absl::StatusOr<std::string> AsStr(const msgpack::object& o, const std::string& path) {
  if (o.type != msgpack::type::STR) return WrongType(path, "string", o);
  return std::string(o.via.str.ptr, o.via.str.size);
}

absl::StatusOr<uint64_t> AsUint(const msgpack::object& o, const std::string& path) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) return o.via.u64;
  if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    return absl::InvalidArgumentError(
        StrCat(path, ": expected a non-negative integer, found ", o.via.i64));
  }
  return WrongType(path, "non-negative integer", o);
}

}  // namespace

std::string_view TypeName(const msgpack::object& object) {
  switch (object.type) {
    case msgpack::type::NIL:
      return "nil";
    case msgpack::type::BOOLEAN:
      return "boolean";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER:
      return "integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return "float";
    case msgpack::type::STR:
      return "string";
    case msgpack::type::BIN:
      return "binary";
    case msgpack::type::ARRAY:
      return "array";
    case msgpack::type::MAP:
      return "map";
    case msgpack::type::EXT:
      return "extension";
  }
  return "unknown";
}

// ---- builders ----

void MapBuilder::Key(std::string_view key) {
  PackStr(packer_, key);
  ++entries_;
}

MapBuilder& MapBuilder::Str(std::string_view key, std::string_view value) {
  Key(key);
  PackStr(packer_, value);
  return *this;
}

MapBuilder& MapBuilder::Bin(std::string_view key, std::string_view bytes) {
  Key(key);
  packer_.pack_bin(static_cast<uint32_t>(bytes.size()));
  packer_.pack_bin_body(bytes.data(), static_cast<uint32_t>(bytes.size()));
  return *this;
}

MapBuilder& MapBuilder::Uint(std::string_view key, uint64_t value) {
  Key(key);
  packer_.pack_uint64(value);
  return *this;
}

MapBuilder& MapBuilder::Int(std::string_view key, int64_t value) {
  Key(key);
  packer_.pack_int64(value);
  return *this;
}

MapBuilder& MapBuilder::Bool(std::string_view key, bool value) {
  Key(key);
  if (value) {
    packer_.pack_true();
  } else {
    packer_.pack_false();
  }
  return *this;
}

MapBuilder& MapBuilder::Double(std::string_view key, double value) {
  Key(key);
  packer_.pack_double(value);
  return *this;
}

MapBuilder& MapBuilder::StrList(std::string_view key, const std::vector<std::string>& values) {
  Key(key);
  packer_.pack_array(static_cast<uint32_t>(values.size()));
  for (const std::string& v : values) PackStr(packer_, v);
  return *this;
}

MapBuilder& MapBuilder::UintList(std::string_view key, const std::vector<uint64_t>& values) {
  Key(key);
  packer_.pack_array(static_cast<uint32_t>(values.size()));
  for (uint64_t v : values) packer_.pack_uint64(v);
  return *this;
}

MapBuilder& MapBuilder::Map(std::string_view key, const MapBuilder& nested) {
  Key(key);
  nested.AppendPacked(buffer_);
  return *this;
}

MapBuilder& MapBuilder::StrMap(std::string_view key,
                               const std::map<std::string, std::string>& values) {
  Key(key);
  packer_.pack_map(static_cast<uint32_t>(values.size()));
  for (const auto& [k, v] : values) {
    PackStr(packer_, k);
    PackStr(packer_, v);
  }
  return *this;
}

MapBuilder& MapBuilder::List(std::string_view key, const ListBuilder& nested) {
  Key(key);
  nested.AppendPacked(buffer_);
  return *this;
}

MapBuilder& MapBuilder::Entries(const MapBuilder& other) {
  buffer_.write(other.buffer_.data(), other.buffer_.size());
  entries_ += other.entries_;
  return *this;
}

void MapBuilder::AppendPacked(msgpack::sbuffer& out) const {
  msgpack::packer<msgpack::sbuffer> p(out);
  p.pack_map(static_cast<uint32_t>(entries_));
  out.write(buffer_.data(), buffer_.size());
}

ListBuilder& ListBuilder::AddMap(const MapBuilder& map) {
  map.AppendPacked(buffer_);
  ++entries_;
  return *this;
}

ListBuilder& ListBuilder::AddStr(std::string_view value) {
  PackStr(packer_, value);
  ++entries_;
  return *this;
}

ListBuilder& ListBuilder::AddUint(uint64_t value) {
  packer_.pack_uint64(value);
  ++entries_;
  return *this;
}

void ListBuilder::AppendPacked(msgpack::sbuffer& out) const {
  msgpack::packer<msgpack::sbuffer> p(out);
  p.pack_array(static_cast<uint32_t>(entries_));
  out.write(buffer_.data(), buffer_.size());
}

std::string EncodeFrame(std::string_view type, const MapBuilder& body) {
  msgpack::sbuffer out;
  msgpack::packer<msgpack::sbuffer> p(out);
  p.pack_array(3);
  p.pack_uint32(kVersion);
  PackStr(p, type);
  body.AppendPacked(out);
  return std::string(out.data(), out.size());
}

// ---- views ----

absl::StatusOr<MapView> MapView::Of(const msgpack::object& object, std::string path) {
  if (object.type != msgpack::type::MAP) return WrongType(path, "map", object);
  MapView view;
  view.object_ = &object;
  view.path_ = std::move(path);
  return view;
}

std::string MapView::FieldPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : StrCat(path_, ".", key);
}

const msgpack::object* MapView::Find(std::string_view key) const {
  if (object_ == nullptr) return nullptr;
  const msgpack::object_map& map = object_->via.map;
  for (uint32_t i = 0; i < map.size; ++i) {
    const msgpack::object& k = map.ptr[i].key;
    if (k.type == msgpack::type::STR && std::string_view(k.via.str.ptr, k.via.str.size) == key) {
      return &map.ptr[i].val;
    }
  }
  return nullptr;
}

absl::StatusOr<const msgpack::object*> MapView::Require(std::string_view key) const {
  const msgpack::object* o = Find(key);
  if (o == nullptr) {
    return absl::InvalidArgumentError(StrCat(FieldPath(key), ": missing"));
  }
  return o;
}

absl::StatusOr<std::string> MapView::Str(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  return AsStr(**o, FieldPath(key));
}

absl::StatusOr<std::string_view> MapView::Bin(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  const msgpack::object& v = **o;
  if (v.type == msgpack::type::BIN) return std::string_view(v.via.bin.ptr, v.via.bin.size);
  if (v.type == msgpack::type::STR) return std::string_view(v.via.str.ptr, v.via.str.size);
  return WrongType(FieldPath(key), "binary", v);
}

absl::StatusOr<uint64_t> MapView::Uint(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  return AsUint(**o, FieldPath(key));
}

absl::StatusOr<int64_t> MapView::Int(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  const msgpack::object& v = **o;
  if (v.type == msgpack::type::NEGATIVE_INTEGER) return v.via.i64;
  if (v.type == msgpack::type::POSITIVE_INTEGER) {
    if (v.via.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(StrCat(FieldPath(key), ": integer out of range"));
    }
    return static_cast<int64_t>(v.via.u64);
  }
  return WrongType(FieldPath(key), "integer", v);
}

absl::StatusOr<bool> MapView::Bool(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  if ((*o)->type != msgpack::type::BOOLEAN) return WrongType(FieldPath(key), "boolean", **o);
  return (*o)->via.boolean;
}

absl::StatusOr<double> MapView::Double(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  const msgpack::object& v = **o;
  if (v.type == msgpack::type::FLOAT64 || v.type == msgpack::type::FLOAT32) return v.via.f64;
  if (v.type == msgpack::type::POSITIVE_INTEGER) return static_cast<double>(v.via.u64);
  if (v.type == msgpack::type::NEGATIVE_INTEGER) return static_cast<double>(v.via.i64);
  return WrongType(FieldPath(key), "number", v);
}

absl::StatusOr<std::vector<std::string>> MapView::StrList(std::string_view key) const {
  absl::StatusOr<ListView> list = List(key);
  if (!list.ok()) return list.status();
  std::vector<std::string> out;
  out.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    absl::StatusOr<std::string> s = list->StrAt(i);
    if (!s.ok()) return s.status();
    out.push_back(*std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<uint64_t>> MapView::UintList(std::string_view key) const {
  absl::StatusOr<ListView> list = List(key);
  if (!list.ok()) return list.status();
  std::vector<uint64_t> out;
  out.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    absl::StatusOr<uint64_t> v = list->UintAt(i);
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

absl::StatusOr<MapView> MapView::Map(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  return MapView::Of(**o, FieldPath(key));
}

absl::StatusOr<std::map<std::string, std::string>> MapView::StrMap(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  const std::string path = FieldPath(key);
  if ((*o)->type != msgpack::type::MAP) return WrongType(path, "map", **o);
  std::map<std::string, std::string> out;
  const msgpack::object_map& map = (*o)->via.map;
  for (uint32_t i = 0; i < map.size; ++i) {
    absl::StatusOr<std::string> k = AsStr(map.ptr[i].key, StrCat(path, " key"));
    if (!k.ok()) return k.status();
    absl::StatusOr<std::string> v = AsStr(map.ptr[i].val, StrCat(path, ".", *k));
    if (!v.ok()) return v.status();
    out.emplace(*std::move(k), *std::move(v));
  }
  return out;
}

absl::StatusOr<ListView> MapView::List(std::string_view key) const {
  absl::StatusOr<const msgpack::object*> o = Require(key);
  if (!o.ok()) return o.status();
  return ListView::Of(**o, FieldPath(key));
}

absl::StatusOr<std::string> MapView::StrOr(std::string_view key, std::string_view def) const {
  if (!Has(key)) return std::string(def);
  return Str(key);
}

absl::StatusOr<uint64_t> MapView::UintOr(std::string_view key, uint64_t def) const {
  if (!Has(key)) return def;
  return Uint(key);
}

absl::StatusOr<bool> MapView::BoolOr(std::string_view key, bool def) const {
  if (!Has(key)) return def;
  return Bool(key);
}

absl::StatusOr<ListView> ListView::Of(const msgpack::object& object, std::string path) {
  if (object.type != msgpack::type::ARRAY) return WrongType(path, "array", object);
  ListView view;
  view.object_ = &object;
  view.path_ = std::move(path);
  return view;
}

std::string ListView::ElementPath(size_t i) const { return StrCat(path_, "[", i, "]"); }

absl::StatusOr<MapView> ListView::MapAt(size_t i) const {
  if (i >= size()) return absl::OutOfRangeError(ElementPath(i));
  return MapView::Of(object_->via.array.ptr[i], ElementPath(i));
}

absl::StatusOr<std::string> ListView::StrAt(size_t i) const {
  if (i >= size()) return absl::OutOfRangeError(ElementPath(i));
  return AsStr(object_->via.array.ptr[i], ElementPath(i));
}

absl::StatusOr<uint64_t> ListView::UintAt(size_t i) const {
  if (i >= size()) return absl::OutOfRangeError(ElementPath(i));
  return AsUint(object_->via.array.ptr[i], ElementPath(i));
}

// ---- frames ----

absl::StatusOr<Frame> DecodeFrame(std::string_view bytes, const Limits& limits) {
  if (bytes.empty()) return absl::InvalidArgumentError("wire: empty frame");
  if (bytes.size() > limits.max_frame_bytes) {
    return absl::InvalidArgumentError(StrCat(
        "wire: frame of ", bytes.size(), " bytes exceeds the limit of ", limits.max_frame_bytes));
  }
  Frame frame;
  size_t offset = 0;
  try {
    msgpack::unpack_limit limit(limits.max_elements, limits.max_elements, limits.max_string,
                                limits.max_binary, limits.max_binary, limits.max_depth);
    frame.handle = msgpack::unpack(bytes.data(), bytes.size(), offset, nullptr, nullptr, limit);
  } catch (const msgpack::depth_size_overflow&) {
    return absl::InvalidArgumentError("wire: frame nests deeper than the limit");
  } catch (const msgpack::size_overflow& e) {
    return absl::InvalidArgumentError(StrCat("wire: frame exceeds a size limit (", e.what(), ")"));
  } catch (const msgpack::insufficient_bytes&) {
    return absl::InvalidArgumentError(StrCat("wire: truncated frame (", bytes.size(), " bytes)"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(StrCat("wire: malformed frame: ", e.what()));
  }
  if (offset != bytes.size()) {
    return absl::InvalidArgumentError(
        StrCat("wire: ", bytes.size() - offset, " trailing bytes after the frame"));
  }
  const msgpack::object& root = frame.handle.get();
  if (root.type != msgpack::type::ARRAY || root.via.array.size != 3) {
    return absl::InvalidArgumentError(
        "wire: a frame is an array [version, type, body]; found something else");
  }
  const msgpack::object* items = root.via.array.ptr;
  absl::StatusOr<uint64_t> version = AsUint(items[0], "wire: version");
  if (!version.ok()) return version.status();
  if (*version < kMinVersion || *version > kVersion) {
    return absl::InvalidArgumentError(StrCat("wire: frame version ", *version,
                                             " is not supported (this build reads ", kMinVersion,
                                             "..", kVersion, ")"));
  }
  absl::StatusOr<std::string> type = AsStr(items[1], "wire: type");
  if (!type.ok()) return type.status();
  if (type->empty()) return absl::InvalidArgumentError("wire: empty message type");
  frame.version = static_cast<uint32_t>(*version);
  frame.type = *std::move(type);
  absl::StatusOr<MapView> body = MapView::Of(items[2], frame.type);
  if (!body.ok()) return body.status();
  frame.body = *std::move(body);
  return frame;
}

}  // namespace connex::wire
