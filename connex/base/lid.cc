#include "connex/base/lid.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "connex/base/strings.h"

namespace connex {
namespace {

absl::StatusOr<uint32_t> ParseIndex(std::string_view part, char prefix, std::string_view whole) {
  if (part.size() < 2 || part[0] != prefix) {
    return absl::InvalidArgumentError(StrCat("LID '", whole, "': expected '",
                                             std::string(1, prefix), "<number>' but found '", part,
                                             "'"));
  }
  std::string_view digits = part.substr(1);
  for (char c : digits) {
    if (c < '0' || c > '9') {
      return absl::InvalidArgumentError(StrCat("LID '", whole, "': '", part, "' is not '",
                                               std::string(1, prefix),
                                               "' followed by a decimal number"));
    }
  }
  uint32_t value = 0;
  if (digits.size() > 10 || !absl::SimpleAtoi(AsAbsl(digits), &value)) {
    return absl::InvalidArgumentError(
        StrCat("LID '", whole, "': index in '", part, "' is out of range"));
  }
  return value;
}

}  // namespace

std::string Lid::ToString() const { return StrCat(model, "/g", group, "/s", shard, "/r", replica); }

absl::Status Lid::ValidateModel(std::string_view model) {
  if (model.empty()) return absl::InvalidArgumentError("LID model name is empty");
  if (model.size() > kMaxModelLength) {
    return absl::InvalidArgumentError(
        StrCat("LID model name is ", model.size(), " bytes long; the limit is ", kMaxModelLength));
  }
  for (char c : model) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(StrCat("LID model name '", model, "' contains '",
                                               std::string(1, c),
                                               "'; allowed are letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Lid> Lid::Parse(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t slash = text.find('/', start);
    parts.push_back(text.substr(start, slash == std::string_view::npos ? slash : slash - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  if (parts.size() != 4) {
    return absl::InvalidArgumentError(
        StrCat("LID '", text, "': expected 4 parts 'model/g<group>/s<shard>/r<replica>', found ",
               parts.size()));
  }
  Lid lid;
  absl::Status model_ok = ValidateModel(parts[0]);
  if (!model_ok.ok()) {
    return absl::InvalidArgumentError(StrCat("LID '", text, "': ", model_ok.message()));
  }
  lid.model = std::string(parts[0]);
  absl::StatusOr<uint32_t> group = ParseIndex(parts[1], 'g', text);
  if (!group.ok()) return group.status();
  absl::StatusOr<uint32_t> shard = ParseIndex(parts[2], 's', text);
  if (!shard.ok()) return shard.status();
  absl::StatusOr<uint32_t> replica = ParseIndex(parts[3], 'r', text);
  if (!replica.ok()) return replica.status();
  lid.group = *group;
  lid.shard = *shard;
  lid.replica = *replica;
  return lid;
}

}  // namespace connex
