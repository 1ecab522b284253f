#include "connex/engine/internal/hf_components.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/internal/hf_json.h"
#include "connex/engine/internal/hf_regex.h"
#include "connex/engine/internal/utf8.h"
#include "nlohmann/json.hpp"

namespace connex::engine::internal {
namespace {

using nlohmann::json;

// ---- Normalizers ----

class NormalizerSequence : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& p : parts_) CONNEX_RETURN_IF_ERROR(p->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  absl::Status Normalize(std::string* text) const override {
    text->insert(0, prefix_);
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override {
    CONNEX_ASSIGN_OR_RETURN(*text, pattern_.ReplaceAll(*text, content_));
    return absl::OkStatus();
  }

 private:
  Regex pattern_;
  std::string content_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* normalizer) : normalizer_(normalizer) {}
  absl::Status Normalize(std::string* text) const override {
    bool ascii = std::all_of(text->begin(), text->end(),
                             [](char c) { return static_cast<unsigned char>(c) < 0x80; });
    if (ascii) return absl::OkStatus();  // ASCII is in every normalization form
    UErrorCode status = U_ZERO_ERROR;
    icu::UnicodeString normalized =
        normalizer_->normalize(icu::UnicodeString::fromUTF8(*text), status);
    if (U_FAILURE(status)) {
      return absl::InternalError(StrCat("ICU normalization failed: ", u_errorName(status)));
    }
    text->clear();
    normalized.toUTF8String(*text);
    return absl::OkStatus();
  }

 private:
  const icu::Normalizer2* normalizer_;  // owned by ICU
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text) const override {
    std::string_view v = *text;
    if (left_) v = TrimJsStart(v);
    if (right_) v = TrimJsEnd(v);
    *text = std::string(v);
    return absl::OkStatus();
  }

 private:
  bool left_;
  bool right_;
};

// ---- Pre-tokenizers ----

class PreTokenizerSequence : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status PreTokenize(std::vector<std::string>* pieces, int section) const override {
    for (const auto& p : parts_) CONNEX_RETURN_IF_ERROR(p->PreTokenize(pieces, section));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// Split with behavior "Isolated" (matches and the text between them are pieces) or "Removed"
// (only the text between matches is).
class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, bool keep_matches)
      : pattern_(std::move(pattern)), keep_matches_(keep_matches) {}
  absl::Status PreTokenize(std::vector<std::string>* pieces, int) const override {
    std::vector<std::string> out;
    for (const std::string& piece : *pieces) {
      CONNEX_ASSIGN_OR_RETURN(std::vector<Regex::Match> matches, pattern_.FindAll(piece));
      size_t prev = 0;
      for (const Regex::Match& m : matches) {
        if (m.begin > prev) out.push_back(piece.substr(prev, m.begin - prev));
        if (keep_matches_ && m.end > m.begin) out.push_back(piece.substr(m.begin, m.end - m.begin));
        prev = m.end;
      }
      if (prev < piece.size()) out.push_back(piece.substr(prev));
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  Regex pattern_;
  bool keep_matches_;
};

// GPT-2's pre-tokenizer: optionally a space before each piece, optionally GPT-2's split (only the
// matches are kept, as in the reference), then every byte written as its byte-level character.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}
  absl::Status PreTokenize(std::vector<std::string>* pieces, int) const override {
    std::vector<std::string> out;
    for (std::string& piece : *pieces) {
      if (add_prefix_space_ && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
      if (!split_) {
        out.push_back(ToByteLevel(piece));
        continue;
      }
      CONNEX_ASSIGN_OR_RETURN(std::vector<Regex::Match> matches, split_->FindAll(piece));
      for (const Regex::Match& m : matches) {
        out.push_back(ToByteLevel(std::string_view(piece).substr(m.begin, m.end - m.begin)));
      }
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  static std::string ToByteLevel(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) AppendUtf8(ByteToChar()[static_cast<unsigned char>(c)], &out);
    return out;
  }
  bool add_prefix_space_;
  std::optional<Regex> split_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

// SentencePiece-style: spaces become the replacement character (U+2581), which is also prepended
// to the text (per `prepend_scheme`).
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  absl::Status PreTokenize(std::vector<std::string>* pieces, int section) const override {
    for (std::string& piece : *pieces) {
      piece = absl::StrReplaceAll(piece, {{" ", AsAbsl(replacement_)}});
      bool prepend =
          scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && section == 0);
      if (prepend && piece.compare(0, replacement_.size(), replacement_) != 0) {
        piece.insert(0, replacement_);
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

absl::StatusOr<PrependScheme> MetaspaceScheme(const json& j, const std::string& where) {
  auto it = j.find("prepend_scheme");
  if (it == j.end() || it->is_null()) {
    return BoolField(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  std::string s = it->is_string() ? it->get<std::string>() : "";
  if (s == "always") return PrependScheme::kAlways;
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  return Unsupported(where, StrCat("Metaspace prepend_scheme ", DumpJson(*it)));
}

// ---- Post-processors ----

class TemplateProcessor : public PostProcessor {
 public:
  // `items`: a special token's id, or -1 for the sequence.
  explicit TemplateProcessor(std::vector<int32_t> items) : items_(std::move(items)) {}
  void Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    std::vector<int32_t> out;
    out.reserve(ids->size() + items_.size());
    for (int32_t item : items_) {
      if (item < 0) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else if (add_special_tokens) {
        out.push_back(item);
      }
    }
    *ids = std::move(out);
  }

 private:
  std::vector<int32_t> items_;
};

// ByteLevel's post-processing only adjusts offsets, which we do not report.
class NoopPostProcessor : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*, bool) const override {}
};

class PostProcessorSequence : public PostProcessor {
 public:
  explicit PostProcessorSequence(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    for (const auto& p : parts_) p->Process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> MakeTemplate(const json& j, const std::string& where,
                                                            const TokenIdLookup& lookup) {
  auto single = j.find("single");
  if (single == j.end() || !single->is_array()) {
    return absl::InvalidArgumentError(StrCat(where, ": field \"single\" is missing"));
  }
  std::vector<int32_t> items;
  for (const json& item : *single) {
    if (auto seq = item.find("Sequence"); seq != item.end()) {
      if (seq->value("id", "") != "A") return Unsupported(where, "a single template with B");
      items.push_back(-1);
    } else if (auto sp = item.find("SpecialToken"); sp != item.end()) {
      std::string token = sp->value("id", "");
      std::optional<int32_t> id = lookup(token);
      if (!id) {
        return absl::InvalidArgumentError(
            StrCat(where, ": special token \"", token, "\" is not in the vocabulary"));
      }
      items.push_back(*id);
    } else {
      return Unsupported(where, StrCat("template item ", DumpJson(item)));
    }
  }
  return std::make_unique<TemplateProcessor>(std::move(items));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const json& j,
                                                           const std::string& where) {
  if (j.is_null()) return nullptr;
  CONNEX_ASSIGN_OR_RETURN(std::string type, StringField(j, where, "type"));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const json& part : j.value("normalizers", json::array())) {
      CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> n, MakeNormalizer(part, where));
      if (n != nullptr) parts.push_back(std::move(n));
    }
    return std::make_unique<NormalizerSequence>(std::move(parts));
  }
  if (type == "Prepend") {
    CONNEX_ASSIGN_OR_RETURN(std::string prefix, StringField(j, where, "prepend"));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    CONNEX_ASSIGN_OR_RETURN(Regex pattern, MakePattern(j, where));
    CONNEX_ASSIGN_OR_RETURN(std::string content, StringField(j, where, "content"));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(BoolField(j, "strip_left", false),
                                             BoolField(j, "strip_right", false));
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = nullptr;
  if (type == "NFC") form = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") form = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") form = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") form = icu::Normalizer2::getNFKDInstance(status);
  if (form != nullptr && U_SUCCESS(status)) return std::make_unique<UnicodeNormalizer>(form);
  return Unsupported(where, StrCat("type \"", type, "\""));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json& j,
                                                               const std::string& where) {
  if (j.is_null()) return nullptr;
  CONNEX_ASSIGN_OR_RETURN(std::string type, StringField(j, where, "type"));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const json& part : j.value("pretokenizers", json::array())) {
      CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> p, MakePreTokenizer(part, where));
      if (p != nullptr) parts.push_back(std::move(p));
    }
    return std::make_unique<PreTokenizerSequence>(std::move(parts));
  }
  if (type == "Split") {
    if (BoolField(j, "invert", false)) return Unsupported(where, "Split with invert");
    std::string behavior = absl::AsciiStrToLower(j.value("behavior", ""));
    if (behavior != "isolated" && behavior != "removed") {
      return Unsupported(where, StrCat("Split behavior \"", j.value("behavior", ""), "\""));
    }
    CONNEX_ASSIGN_OR_RETURN(Regex pattern, MakePattern(j, where));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior == "isolated");
  }
  if (type == "Digits") {
    // SmolLM's (and StarCoder's): numerals isolated, each alone with individual_digits, else in
    // runs. Hugging Face's test is Rust's char::is_numeric, the Unicode categories Nd, Nl and No:
    // \p{N} ("½" and "١" too; transformers.js's \d is ASCII only).
    const bool individual = BoolField(j, "individual_digits", false);
    CONNEX_ASSIGN_OR_RETURN(Regex digits, Regex::Compile(individual ? "\\p{N}" : "\\p{N}+"));
    return std::make_unique<SplitPreTokenizer>(std::move(digits), /*keep_matches=*/true);
  }
  if (type == "ByteLevel") {
    std::optional<Regex> split;
    if (BoolField(j, "use_regex", true)) {
      CONNEX_ASSIGN_OR_RETURN(
          split, Regex::Compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
                                "\\s+(?!\\S)|\\s+"));
    }
    return std::make_unique<ByteLevelPreTokenizer>(BoolField(j, "add_prefix_space", false),
                                                   std::move(split));
  }
  if (type == "Metaspace") {
    if (BoolField(j, "split", false)) return Unsupported(where, "Metaspace with split: true");
    CONNEX_ASSIGN_OR_RETURN(std::string replacement, StringField(j, where, "replacement"));
    CONNEX_ASSIGN_OR_RETURN(PrependScheme scheme, MetaspaceScheme(j, where));
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme);
  }
  return Unsupported(where, StrCat("type \"", type, "\""));
}

absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const json& j,
                                                                 const std::string& where,
                                                                 const TokenIdLookup& lookup) {
  if (j.is_null()) return nullptr;
  CONNEX_ASSIGN_OR_RETURN(std::string type, StringField(j, where, "type"));
  if (type == "TemplateProcessing") return MakeTemplate(j, where, lookup);
  if (type == "ByteLevel") return std::make_unique<NoopPostProcessor>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const json& part : j.value("processors", json::array())) {
      CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<PostProcessor> p,
                              MakePostProcessor(part, where, lookup));
      if (p != nullptr) parts.push_back(std::move(p));
    }
    return std::make_unique<PostProcessorSequence>(std::move(parts));
  }
  return Unsupported(where, StrCat("type \"", type, "\""));
}

absl::Status Unsupported(const std::string& where, std::string_view what) {
  return absl::InvalidArgumentError(StrCat(where, ": ", what, " is not supported"));
}

absl::StatusOr<std::string> StringField(const json& j, const std::string& where,
                                        const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        StrCat(where, ": field \"", field, "\" is missing or not a string"));
  }
  return it->get<std::string>();
}

bool BoolField(const json& j, const char* field, bool fallback) {
  auto it = j.find(field);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

int IntField(const json& j, const char* field, int fallback) {
  auto it = j.find(field);
  return it != j.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

absl::StatusOr<Regex> MakePattern(const json& j, const std::string& where) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object()) {
    return absl::InvalidArgumentError(StrCat(where, ": field \"pattern\" is missing"));
  }
  auto s = it->find("String");
  auto r = it->find("Regex");
  bool literal = s != it->end() && s->is_string();
  if (!literal && (r == it->end() || !r->is_string())) {
    return absl::InvalidArgumentError(
        StrCat(where, ": pattern is neither {\"String\": ...} nor {\"Regex\": ...}"));
  }
  absl::StatusOr<Regex> regex =
      literal ? Regex::Literal(s->get<std::string>()) : Regex::Compile(r->get<std::string>());
  if (!regex.ok()) return Annotate(regex.status(), where);
  return regex;
}

}  // namespace connex::engine::internal
