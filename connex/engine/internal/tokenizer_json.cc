#include "connex/engine/internal/tokenizer_json.h"

#include <limits>

#include "connex/base/strings.h"
#include "nlohmann/json.hpp"
#include "simdjson.h"

namespace connex::engine::internal {
namespace {

using nlohmann::json;
namespace dom = simdjson::dom;

// The element as nlohmann's parser would have made it: non-negative integers unsigned, objects'
// duplicate keys the last one's.
json ToNlohmann(dom::element e) {
  switch (e.type()) {
    case dom::element_type::OBJECT: {
      json out = json::object();
      for (dom::key_value_pair field : dom::object(e)) {
        out[std::string(field.key)] = ToNlohmann(field.value);
      }
      return out;
    }
    case dom::element_type::ARRAY: {
      json out = json::array();
      for (dom::element item : dom::array(e)) out.push_back(ToNlohmann(item));
      return out;
    }
    case dom::element_type::INT64: {
      int64_t v = int64_t(e);
      return v >= 0 ? json(static_cast<uint64_t>(v)) : json(v);
    }
    case dom::element_type::UINT64:
      return json(uint64_t(e));
    case dom::element_type::DOUBLE:
      return json(double(e));
    case dom::element_type::STRING:
      return json(std::string(std::string_view(e)));
    case dom::element_type::BOOL:
      return json(bool(e));
    case dom::element_type::NULL_VALUE:
      return json(nullptr);
  }
  return json(nullptr);
}

// The field `key` of `object` when it has type `type`.
std::optional<dom::element> FieldOfType(dom::element object, std::string_view key,
                                        dom::element_type type) {
  dom::element value;
  if (object.type() != dom::element_type::OBJECT || object[key].get(value) != simdjson::SUCCESS ||
      value.type() != type) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

struct TokenizerJson::Impl {
  std::string name;
  dom::parser parser;  // owns the document
  std::optional<dom::element> vocab;
  std::optional<dom::element> merges;
  json rest;
};

TokenizerJson::TokenizerJson(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenizerJson::~TokenizerJson() = default;

absl::StatusOr<std::unique_ptr<TokenizerJson>> TokenizerJson::Parse(std::string_view text,
                                                                    const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  dom::element doc;
  if (simdjson::error_code error = impl->parser.parse(text.data(), text.size()).get(doc)) {
    return absl::InvalidArgumentError(
        StrCat(name, ": not valid JSON: ", simdjson::error_message(error)));
  }
  if (doc.type() != dom::element_type::OBJECT) {
    return absl::InvalidArgumentError(StrCat(name, ": not valid JSON: not an object"));
  }
  std::optional<dom::element> model = FieldOfType(doc, "model", dom::element_type::OBJECT);
  if (model) {
    impl->vocab = FieldOfType(*model, "vocab", dom::element_type::OBJECT);
    impl->merges = FieldOfType(*model, "merges", dom::element_type::ARRAY);
  }
  // Everything but the tables, as nlohmann's parser would have read it.
  impl->rest = json::object();
  for (dom::key_value_pair field : dom::object(doc)) {
    if (field.key != "model" || field.value.type() != dom::element_type::OBJECT) {
      impl->rest[std::string(field.key)] = ToNlohmann(field.value);
      continue;
    }
    json m = json::object();
    for (dom::key_value_pair f : dom::object(field.value)) {
      if ((f.key == "vocab" && f.value.type() == dom::element_type::OBJECT) ||
          (f.key == "merges" && f.value.type() == dom::element_type::ARRAY)) {
        continue;
      }
      m[std::string(f.key)] = ToNlohmann(f.value);
    }
    impl->rest["model"] = std::move(m);
  }
  return std::unique_ptr<TokenizerJson>(new TokenizerJson(std::move(impl)));
}

const json& TokenizerJson::rest() const { return impl_->rest; }

bool TokenizerJson::has_bpe_tables() const {
  return impl_->vocab.has_value() && impl_->merges.has_value();
}

absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> TokenizerJson::Vocab() const {
  if (!impl_->vocab) {
    return absl::InvalidArgumentError(StrCat(impl_->name, ": model.vocab is not an object"));
  }
  dom::object vocab(*impl_->vocab);
  absl::flat_hash_map<std::string, int32_t> out;
  out.reserve(vocab.size());
  for (dom::key_value_pair token : vocab) {
    int64_t id = 0;
    if (token.value.get_int64().get(id) != simdjson::SUCCESS) {
      return absl::InvalidArgumentError(StrCat(impl_->name, ": token \"", token.key, "\" has id ",
                                               simdjson::minify(token.value), ", not an integer"));
    }
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(StrCat(impl_->name, ": token \"", token.key, "\" has ",
                                               id < 0 ? "negative id " : "an id out of range, ",
                                               id));
    }
    out.insert_or_assign(std::string(token.key), static_cast<int32_t>(id));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TokenizerJson::Merges() const {
  if (!impl_->merges) {
    return absl::InvalidArgumentError(StrCat(impl_->name, ": model.merges is not an array"));
  }
  dom::array merges(*impl_->merges);
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (dom::element m : merges) {
    std::string_view s, left, right;
    if (m.get_string().get(s) == simdjson::SUCCESS) {
      // "a b": the reference splits on spaces and keeps the first two parts.
      size_t space = s.find(' ');
      if (space == std::string_view::npos) {
        return absl::InvalidArgumentError(
            StrCat(impl_->name, ": merge \"", s, "\" is not two tokens"));
      }
      size_t end = s.find(' ', space + 1);
      out.emplace_back(s.substr(0, space), s.substr(space + 1, end - space - 1));
      continue;
    }
    dom::array pair;
    if (m.get_array().get(pair) == simdjson::SUCCESS && pair.size() == 2 &&
        pair.at(0).get_string().get(left) == simdjson::SUCCESS &&
        pair.at(1).get_string().get(right) == simdjson::SUCCESS) {
      out.emplace_back(left, right);
      continue;
    }
    return absl::InvalidArgumentError(
        StrCat(impl_->name, ": merge ", simdjson::minify(m), " is not two tokens"));
  }
  return out;
}

}  // namespace connex::engine::internal
