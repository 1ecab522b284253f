// CURVE: encryption and client authentication of Connex's ZeroMQ sockets (the directory's
// ROUTER and PUB, the step protocol's signal sockets), with ZeroMQ's built-in CurveZMQ.
//
// A process that has a key pair (CONNEX_CURVE_KEY_FILE, written by `connexctl keygen`) listens as
// a CURVE server with it and connects as a CURVE client with it. Its listeners accept only the
// client keys in CONNEX_CURVE_AUTHORIZED_KEYS_FILE (default: its own public key, so that a
// deployment that shares one key pair needs nothing else). It reaches the directory with the
// directory's public key CONNEX_DIRECTORY_SERVER_KEY (default: its own public key); the signal
// sockets of other stages with the public key each publishes in its signal address.
//
// Also here: the rule that nothing listens on a non-loopback address unauthenticated unless told
// so (CONNEX_INSECURE=1, `--insecure`), as Redis's protected mode does.
//
// The ZeroMQ side (making a socket a CURVE server or client, the ZAP handler) is in
// curve_zmq.h, so that code that only passes settings around does not compile ZeroMQ's header.
//
// Functions are thread-safe.
#ifndef CONNEX_BASE_CURVE_H_
#define CONNEX_BASE_CURVE_H_

#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace connex {

// Z85 text, 40 characters each.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair();
// InvalidArgument naming `what` unless `z85` is a 40-character Z85 CURVE key.
absl::Status ValidateCurveKey(std::string_view z85, std::string_view what);
// The key pair of a secret key file (its first line: the Z85 secret key; private, mode 600).
absl::StatusOr<CurveKeyPair> LoadCurveKeyFile(const std::string& path);
// Writes PREFIX.key (the secret key, mode 600) and PREFIX.pub (the public key). Refuses to
// overwrite an existing key file.
absl::Status WriteCurveKeyFiles(const std::string& prefix, const CurveKeyPair& keys);
// Public keys, one per line; blank lines and lines starting with '#' are skipped.
absl::StatusOr<std::set<std::string>> LoadAuthorizedKeys(const std::string& path);

// Hex (64 digits) of a Z85 key and back: how a key travels inside an address.
std::string CurveKeyToHex(std::string_view z85);
absl::StatusOr<std::string> CurveKeyFromHex(std::string_view hex);

struct CurveSettings {
  std::optional<CurveKeyPair> keys;  // CONNEX_CURVE_KEY_FILE; none: CURVE is off
  std::set<std::string> authorized;  // CONNEX_CURVE_AUTHORIZED_KEYS_FILE; default {own public}
  std::string directory_key;         // CONNEX_DIRECTORY_SERVER_KEY; default own public key

  bool enabled() const { return keys.has_value(); }
  // From the environment; InvalidArgument naming the variable and the file when a key is bad.
  static absl::StatusOr<CurveSettings> FromEnv();
  // One key pair for everything (tests, a deployment that shares one pair).
  static CurveSettings Shared(const CurveKeyPair& keys);
};

// Whether `host` (an IP address or name of a bind address) is a loopback one: 127.0.0.0/8,
// ::1, localhost.
bool IsLoopbackHost(std::string_view host);
// OK when `host` is loopback, when the listener is `authenticated` (CURVE), or when CONNEX_INSECURE
// is 1; else InvalidArgument naming `what`, the host, and the two ways out.
absl::Status CheckListenExposure(std::string_view what, std::string_view host, bool authenticated);

}  // namespace connex

#endif  // CONNEX_BASE_CURVE_H_
