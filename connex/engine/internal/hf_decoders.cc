// The decoders of tokenizer.json (declared in hf_components.h).
#include <optional>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/internal/hf_components.h"
#include "connex/engine/internal/hf_json.h"
#include "connex/engine/internal/utf8.h"
#include "nlohmann/json.hpp"

namespace connex::engine::internal {
namespace {

using nlohmann::json;

// The byte of a `<0xXX>` token, if `token` is one.
std::optional<unsigned char> ByteToken(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return static_cast<unsigned char>(value);
}

// Byte-level BPE: each token's characters are bytes (ByteToChar); the added tokens stand for
// themselves. Each run of other tokens is decoded as UTF-8 with replacement.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens, const DecodeContext& ctx) const override {
    std::vector<std::string> out;
    std::string run;
    bool in_run = false;
    auto flush = [&] {
      if (in_run) out.push_back(DecodeUtf8Lossy(run));
      run.clear();
      in_run = false;
    };
    for (std::string& token : *tokens) {
      if (ctx.added_tokens != nullptr && ctx.added_tokens->contains(token)) {
        flush();
        out.push_back(std::move(token));
        continue;
      }
      in_run = true;
      for (size_t pos = 0; pos < token.size();) {
        size_t begin = pos;
        int byte = CharToByte(NextCodePoint(token, &pos));
        // A character outside the alphabet (not in a byte-level vocabulary) passes through.
        if (byte < 0) {
          run.append(token, begin, pos - begin);
        } else {
          run.push_back(static_cast<char>(byte));
        }
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens, const DecodeContext&) const override {
    for (std::string& token : *tokens) {
      absl::StatusOr<std::string> replaced = pattern_.ReplaceAll(token, content_);
      // A search cannot exhaust PCRE2's limits on one token of a vocabulary; keep it if it does.
      if (replaced.ok()) token = *std::move(replaced);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

// SentencePiece's byte fallback: each run of `<0xXX>` tokens is decoded as UTF-8 with replacement
// (by a TextDecoder that drops a leading byte order mark, as the reference's does).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens, const DecodeContext&) const override {
    std::vector<std::string> out;
    std::string run;
    for (std::string& token : *tokens) {
      if (std::optional<unsigned char> byte = ByteToken(token)) {
        run.push_back(static_cast<char>(*byte));
        continue;
      }
      if (!run.empty()) out.push_back(DecodeUtf8Lossy(run, /*strip_bom=*/true));
      run.clear();
      out.push_back(std::move(token));
    }
    if (!run.empty()) out.push_back(DecodeUtf8Lossy(run, /*strip_bom=*/true));
    *tokens = std::move(out);
  }
  bool CanCutAfter(std::string_view token) const override { return !ByteToken(token); }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens, const DecodeContext&) const override {
    std::string all = absl::StrJoin(*tokens, "");
    tokens->assign(1, std::move(all));
  }
};

// Removes up to `start` leading copies of `content` from each token (from the text's start only,
// once the tokens are fused).
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start) : content_(std::move(content)), start_(start) {}
  void DecodeChain(std::vector<std::string>* tokens, const DecodeContext& ctx) const override {
    if (ctx.fused && ctx.continuation) return;
    for (std::string& token : *tokens) {
      size_t cut = 0;
      for (int i = 0; i < start_ && token.compare(cut, content_.size(), content_) == 0; ++i) {
        cut += content_.size();
      }
      token.erase(0, cut);
    }
  }

 private:
  std::string content_;
  int start_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens, const DecodeContext& ctx) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      token = absl::StrReplaceAll(token, {{AsAbsl(replacement_), " "}});
      if (strip_first_ && i == 0 && !ctx.continuation && !token.empty() && token[0] == ' ') {
        token.erase(0, 1);
      }
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class DecoderSequence : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens, const DecodeContext& ctx) const override {
    DecodeContext local = ctx;
    for (const auto& p : parts_) {
      p->DecodeChain(tokens, local);
      if (dynamic_cast<const FuseDecoder*>(p.get()) != nullptr) local.fused = true;
    }
  }
  bool CanCutAfter(std::string_view token) const override {
    for (const auto& p : parts_) {
      if (!p->CanCutAfter(token)) return false;
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  CONNEX_ASSIGN_OR_RETURN(std::string type, StringField(j, where, "type"));
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    CONNEX_ASSIGN_OR_RETURN(Regex pattern, MakePattern(j, where));
    CONNEX_ASSIGN_OR_RETURN(std::string content, StringField(j, where, "content"));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    CONNEX_ASSIGN_OR_RETURN(std::string content, StringField(j, where, "content"));
    // Stripping the end would make a streamed text differ from the whole one.
    if (IntField(j, "stop", 0) != 0) return Unsupported(where, "Strip with stop > 0");
    return std::make_unique<StripDecoder>(std::move(content), IntField(j, "start", 0));
  }
  if (type == "Metaspace") {
    CONNEX_ASSIGN_OR_RETURN(std::string replacement, StringField(j, where, "replacement"));
    bool strip_first;
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      strip_first = it->get<std::string>() != "never";
    } else {
      strip_first = BoolField(j, "add_prefix_space", true);
    }
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), strip_first);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const json& part : j.value("decoders", json::array())) {
      CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Decoder> d, MakeDecoder(part, where));
      if (d != nullptr) parts.push_back(std::move(d));
    }
    return std::make_unique<DecoderSequence>(std::move(parts));
  }
  return Unsupported(where, StrCat("type \"", type, "\""));
}

}  // namespace connex::engine::internal
