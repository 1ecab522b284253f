#include "connex/engine/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/internal/bpe.h"
#include "connex/engine/internal/hf_components.h"
#include "connex/engine/internal/tokenizer_json.h"
#include "connex/engine/internal/utf8.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using nlohmann::json;

const json& Field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat(path.string(), ": cannot be read"));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// A token named by tokenizer_config.json: a string, an {"content": ...} object, or null.
absl::StatusOr<std::optional<std::string>> ConfigToken(const json& value, const std::string& where,
                                                       const char* key) {
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && Field(value, "content").is_string()) {
    return Field(value, "content").get<std::string>();
  }
  return absl::InvalidArgumentError(
      StrCat(where, ": ", key, " is neither a string, an object with content, nor null"));
}

// Hugging Face's clean-up of English tokenization spaces, in its order.
void CleanUpTokenizationSpaces(std::string* text) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules)
    *text = absl::StrReplaceAll(*text, {{AsAbsl(from), AsAbsl(to)}});
}

}  // namespace

HfTokenizer::HfTokenizer() = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& model_dir) {
  std::filesystem::path dir(model_dir);
  if (!std::filesystem::exists(dir / "tokenizer.json")) {
    return absl::NotFoundError(StrCat((dir / "tokenizer.json").string(), ": not found"));
  }
  CONNEX_ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFile(dir / "tokenizer.json"));
  std::string config_json;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    CONNEX_ASSIGN_OR_RETURN(config_json, ReadFile(dir / "tokenizer_config.json"));
  }
  return FromJson(tokenizer_json, config_json, model_dir);
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view tokenizer_json,
                                                                   std::string_view config_json,
                                                                   const std::string& name) {
  const std::string tj_name = name.empty() ? "tokenizer.json" : name + "/tokenizer.json";
  const std::string tc_name =
      name.empty() ? "tokenizer_config.json" : name + "/tokenizer_config.json";
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<internal::TokenizerJson> document,
                          internal::TokenizerJson::Parse(tokenizer_json, tj_name));
  const json& tj = document->rest();  // without the vocabulary and the merges
  json config = json::object();
  if (!config_json.empty()) {
    absl::StatusOr<json> parsed = ParseJsonChecked(config_json);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          StrCat(tc_name, ": not valid JSON: ", parsed.status().message()));
    }
    config = *std::move(parsed);
  }
  if (!config.is_object()) return absl::InvalidArgumentError(StrCat(tc_name, ": not an object"));
  auto tokenizer = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  HfTokenizer& t = *tokenizer;
  try {
    // The model.
    const json& model = Field(tj, "model");
    std::string type =
        Field(model, "type").is_string() ? Field(model, "type").get<std::string>() : "(none)";
    if (type != "BPE") {
      return absl::InvalidArgumentError(
          StrCat(tj_name, ": model type \"", type, "\" is not supported"));
    }
    if (!Field(model, "dropout").is_null() && Field(model, "dropout").get<double>() != 0) {
      return absl::InvalidArgumentError(StrCat(tj_name, ": BPE dropout is not supported"));
    }
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json& v = Field(model, affix);
      if (!v.is_null() && !v.get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            StrCat(tj_name, ": BPE ", affix, " \"", v.get<std::string>(), "\" is not supported"));
      }
    }
    if (!document->has_bpe_tables()) {
      return absl::InvalidArgumentError(
          StrCat(tj_name, ": model.vocab or model.merges is missing"));
    }
    CONNEX_ASSIGN_OR_RETURN(auto vocab, document->Vocab());
    int32_t size = 0;
    for (const auto& [text, id] : vocab) size = std::max(size, id + 1);
    CONNEX_ASSIGN_OR_RETURN(auto merges, document->Merges());

    // The added tokens, over the vocabulary.
    absl::flat_hash_set<std::string> special_texts;
    for (const json& a : Field(tj, "added_tokens")) {
      AddedToken added{a.at("content").get<std::string>(), a.at("id").get<int32_t>(),
                       a.value("lstrip", false), a.value("rstrip", false)};
      if (added.id < 0 || added.content.empty()) {
        return absl::InvalidArgumentError(
            StrCat(tj_name, ": added token ", DumpJson(a), " has no content or a bad id"));
      }
      vocab[added.content] = added.id;
      size = std::max(size, added.id + 1);
      if (a.value("special", false)) special_texts.insert(added.content);
      t.added_texts_.insert(added.content);
      t.added_.push_back(std::move(added));
    }
    for (const json& s : Field(config, "additional_special_tokens")) {
      CONNEX_ASSIGN_OR_RETURN(std::optional<std::string> text,
                              ConfigToken(s, tc_name, "additional_special_tokens"));
      if (text) special_texts.insert(*text);
    }
    t.id_to_text_.assign(size, std::string());
    t.has_text_.assign(size, false);
    t.special_.assign(size, false);
    for (const auto& [text, id] : vocab) {
      t.id_to_text_[id] = text;
      t.has_text_[id] = true;
      t.special_[id] = special_texts.contains(text);
    }
    for (const AddedToken& added : t.added_) {  // an added token wins over the vocabulary's
      t.id_to_text_[added.id] = added.content;
      t.special_[added.id] = special_texts.contains(added.content);
    }

    internal::BpeOptions options;
    options.byte_fallback =
        Field(model, "byte_fallback").is_boolean() && Field(model, "byte_fallback").get<bool>();
    options.fuse_unk =
        Field(model, "fuse_unk").is_boolean() && Field(model, "fuse_unk").get<bool>();
    options.ignore_merges =
        Field(model, "ignore_merges").is_boolean() && Field(model, "ignore_merges").get<bool>();
    if (const json& unk = Field(model, "unk_token"); unk.is_string()) {
      auto it = vocab.find(unk.get<std::string>());
      if (it != vocab.end()) options.unk_id = it->second;
    }
    t.model_ = std::make_unique<internal::BpeModel>(std::move(vocab), merges, options);

    // The byte trie of the added tokens.
    t.trie_terminal_.push_back(-1);
    for (size_t k = 0; k < t.added_.size(); ++k) {
      uint64_t node = 0;
      const std::string& content = t.added_[k].content;
      t.trie_first_byte_[static_cast<unsigned char>(content[0])] = true;
      for (char c : content) {
        uint64_t key = node << 8 | static_cast<unsigned char>(c);
        auto [it, inserted] =
            t.trie_children_.try_emplace(key, static_cast<int32_t>(t.trie_terminal_.size()));
        if (inserted) t.trie_terminal_.push_back(-1);
        node = it->second;
      }
      t.trie_terminal_[node] = static_cast<int32_t>(k);
    }

    // The pipeline.
    CONNEX_ASSIGN_OR_RETURN(
        t.normalizer_, internal::MakeNormalizer(Field(tj, "normalizer"), tj_name + ": normalizer"));
    CONNEX_ASSIGN_OR_RETURN(
        t.pre_tokenizer_,
        internal::MakePreTokenizer(Field(tj, "pre_tokenizer"), tj_name + ": pre_tokenizer"));
    CONNEX_ASSIGN_OR_RETURN(
        t.post_processor_,
        internal::MakePostProcessor(Field(tj, "post_processor"), tj_name + ": post_processor",
                                    [&t](std::string_view token) { return t.TokenId(token); }));
    CONNEX_ASSIGN_OR_RETURN(t.decoder_,
                            internal::MakeDecoder(Field(tj, "decoder"), tj_name + ": decoder"));

    // tokenizer_config.json.
    if (const json& v = Field(config, "clean_up_tokenization_spaces"); v.is_boolean()) {
      t.clean_up_tokenization_spaces_ = v.get<bool>();
    }
    for (const char* key : {"remove_space", "do_lowercase_and_remove_accent"}) {
      if (Field(config, key).is_boolean() && Field(config, key).get<bool>()) {
        return absl::InvalidArgumentError(StrCat(tc_name, ": ", key, " is not supported"));
      }
    }
    // transformers.js rebuilds a non-legacy Llama tokenizer's pipeline in code.
    const json& cls = Field(config, "tokenizer_class");
    if (cls.is_string() && cls.get<std::string>().rfind("LlamaTokenizer", 0) == 0 &&
        Field(config, "legacy").is_boolean() && !Field(config, "legacy").get<bool>()) {
      return absl::InvalidArgumentError(
          StrCat(tc_name, ": LlamaTokenizer with \"legacy\": false is not supported"));
    }
    for (auto [key, slot] : {std::pair{"bos_token", &t.bos_}, std::pair{"eos_token", &t.eos_}}) {
      CONNEX_ASSIGN_OR_RETURN(std::optional<std::string> text,
                              ConfigToken(Field(config, key), tc_name, key));
      if (!text) continue;
      std::optional<int32_t> id = t.TokenId(*text);
      if (!id) {
        return absl::InvalidArgumentError(
            StrCat(tc_name, ": ", key, " \"", *text, "\" is not in the vocabulary"));
      }
      *slot = SpecialToken{*text, *id};
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(StrCat(tj_name, ": ", e.what()));
  }
  return tokenizer;
}

std::vector<HfTokenizer::Section> HfTokenizer::SplitAddedTokens(std::string_view text) const {
  std::vector<Section> sections;
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!trie_first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // The longest added token at i.
    int match = -1;
    size_t match_length = 0;
    uint64_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      auto it = trie_children_.find(node << 8 | static_cast<unsigned char>(text[j]));
      if (it == trie_children_.end()) break;
      node = it->second;
      if (trie_terminal_[node] >= 0) {
        match = trie_terminal_[node];
        match_length = j + 1 - i;
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    if (i > start) sections.push_back(Section{text.substr(start, i - start)});
    sections.push_back(Section{text.substr(i, match_length), match});
    i += match_length;
    start = i;
  }
  if (start < text.size()) sections.push_back(Section{text.substr(start)});
  for (size_t k = 0; k < sections.size(); ++k) {
    if (sections[k].added < 0) continue;
    const AddedToken& added = added_[sections[k].added];
    if (added.lstrip && k > 0) sections[k - 1].text = internal::TrimJsEnd(sections[k - 1].text);
    if (added.rstrip && k + 1 < sections.size()) {
      sections[k + 1].text = internal::TrimJsStart(sections[k + 1].text);
    }
  }
  return sections;
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text,
                                                         bool add_special_tokens) const {
  if (std::optional<size_t> bad = internal::FindInvalidUtf8(text)) {
    return absl::InvalidArgumentError(
        StrCat("tokenizer: the text is not valid UTF-8 (byte ", *bad, ")"));
  }
  std::vector<int32_t> ids;
  std::vector<Section> sections = SplitAddedTokens(text);
  for (size_t k = 0; k < sections.size(); ++k) {
    const Section& section = sections[k];
    if (section.added >= 0) {
      ids.push_back(added_[section.added].id);
      continue;
    }
    if (section.text.empty()) continue;
    std::vector<std::string> pieces{std::string(section.text)};
    if (normalizer_ != nullptr) CONNEX_RETURN_IF_ERROR(normalizer_->Normalize(&pieces[0]));
    if (pieces[0].empty()) continue;
    if (pre_tokenizer_ != nullptr) {
      CONNEX_RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&pieces, static_cast<int>(k)));
    }
    CONNEX_RETURN_IF_ERROR(model_->Encode(pieces, &ids));
  }
  if (post_processor_ != nullptr) post_processor_->Process(&ids, add_special_tokens);
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::DecodeFragment(std::span<const int32_t> ids,
                                                        bool skip_special_tokens,
                                                        bool continuation) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) return TokenIdOutOfRange(id, vocab_size());
    if (!has_text_[id] || (skip_special_tokens && special_[id])) continue;
    tokens.push_back(id_to_text_[id]);
  }
  if (decoder_ == nullptr) {
    // No decoder: the tokens joined by spaces (one before a continuation).
    std::string text = absl::StrJoin(tokens, " ");
    return continuation && !tokens.empty() ? " " + text : text;
  }
  internal::DecodeContext ctx;
  ctx.added_tokens = &added_texts_;
  ctx.continuation = continuation;
  decoder_->DecodeChain(&tokens, ctx);
  return absl::StrJoin(tokens, "");
}

absl::StatusOr<std::string> HfTokenizer::Decode(std::span<const int32_t> ids,
                                                const DecodeOptions& options) const {
  CONNEX_ASSIGN_OR_RETURN(std::string text,
                          DecodeFragment(ids, options.skip_special_tokens, false));
  if (options.clean_up_tokenization_spaces.value_or(clean_up_tokenization_spaces_)) {
    CleanUpTokenizationSpaces(&text);
  }
  return text;
}

bool HfTokenizer::CanCutAfter(int32_t id) const {
  if (decoder_ == nullptr || id < 0 || id >= vocab_size() || !has_text_[id]) return true;
  return decoder_->CanCutAfter(id_to_text_[id]);
}

std::optional<int32_t> HfTokenizer::TokenId(std::string_view token) const {
  return model_->TokenId(token);
}

absl::StatusOr<std::string> HfTokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenIdOutOfRange(id, vocab_size());
  if (!has_text_[id]) {
    return absl::NotFoundError(StrCat("tokenizer: no token has id ", id));
  }
  return id_to_text_[id];
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

}  // namespace connex::engine
