#include "connex/directory/etcd/endpoints.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_split.h"
#include "connex/base/strings.h"

namespace connex::directory::etcd {
namespace {

absl::Status Invalid(std::string_view address, std::string_view why) {
  return absl::InvalidArgumentError(
      StrCat("etcd address '", address, "': ", why, " (expected etcd://HOST:PORT[,HOST:PORT...])"));
}

bool ValidHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

}  // namespace

std::string EtcdEndpoint::ToString() const {
  if (host.find(':') != std::string::npos) return StrCat("[", host, "]:", port);
  return StrCat(host, ":", port);
}

bool IsEtcdAddress(std::string_view address) { return address.starts_with(kEtcdScheme); }

absl::StatusOr<std::vector<EtcdEndpoint>> ParseEtcdAddress(std::string_view address) {
  if (!IsEtcdAddress(address)) return Invalid(address, "it does not start with etcd://");
  std::string_view list = address.substr(kEtcdScheme.size());
  if (list.empty()) return Invalid(address, "no member is listed");
  std::vector<EtcdEndpoint> members;
  for (absl::string_view piece : absl::StrSplit(AsAbsl(list), ',')) {
    std::string_view member = AsStd(piece);
    if (member.empty()) return Invalid(address, "an empty member (two commas, or a trailing one)");
    EtcdEndpoint endpoint;
    std::string_view port_text;
    if (member.front() == '[') {
      size_t close = member.find(']');
      if (close == std::string_view::npos) {
        return Invalid(address, StrCat("member '", member, "': '[' without ']'"));
      }
      endpoint.host = std::string(member.substr(1, close - 1));
      if (close + 1 >= member.size() || member[close + 1] != ':') {
        return Invalid(address, StrCat("member '", member, "' has no :PORT"));
      }
      port_text = member.substr(close + 2);
      bool v6 = !endpoint.host.empty() &&
                std::all_of(endpoint.host.begin(), endpoint.host.end(), [](char c) {
                  return c == ':' || c == '.' || std::isxdigit(static_cast<unsigned char>(c));
                });
      if (!v6) {
        return Invalid(address, StrCat("member '", member, "': not an IPv6 address in brackets"));
      }
    } else {
      size_t colon = member.rfind(':');
      if (colon == std::string_view::npos) {
        return Invalid(address, StrCat("member '", member, "' has no :PORT"));
      }
      endpoint.host = std::string(member.substr(0, colon));
      port_text = member.substr(colon + 1);
      if (endpoint.host.empty())
        return Invalid(address, StrCat("member '", member, "' has no host"));
      if (!std::all_of(endpoint.host.begin(), endpoint.host.end(), ValidHostChar)) {
        return Invalid(address, StrCat("member '", member, "': host '", endpoint.host,
                                       "' is not a name or an IPv4 address (a path, a scheme, "
                                       "or an IPv6 address without brackets?)"));
      }
    }
    unsigned port = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
        port == 0 || port > 65535) {
      return Invalid(address,
                     StrCat("member '", member, "': port '", port_text, "' is not 1-65535"));
    }
    endpoint.port = static_cast<uint16_t>(port);
    if (std::find(members.begin(), members.end(), endpoint) != members.end()) {
      return Invalid(address, StrCat("member '", member, "' is listed twice"));
    }
    members.push_back(std::move(endpoint));
  }
  return members;
}

}  // namespace connex::directory::etcd
