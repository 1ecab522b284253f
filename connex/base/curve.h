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
// Functions are thread-safe; a ZapHandler is one thread of its own.
#ifndef CONNEX_BASE_CURVE_H_
#define CONNEX_BASE_CURVE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "zmq.hpp"

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

// Makes `socket` (not yet bound) a CURVE server with the settings' key pair; the context's
// ZapHandler decides which clients get in. No-op when CURVE is off.
void MakeCurveServer(zmq::socket_t& socket, const CurveSettings& settings);
// Makes `socket` (not yet connected) a CURVE client of the server with public key
// `server_key` (Z85). No-op when CURVE is off.
void MakeCurveClient(zmq::socket_t& socket, const CurveSettings& settings,
                     std::string_view server_key);

// The ZAP handler of one ZeroMQ context: accepts a CURVE client whose public key is in
// `authorized`, refuses (and counts, and logs) any other. Without one, a CURVE server would
// accept every key. Start it before binding any CURVE server socket of `context`; stop it (the
// destructor) before closing the context.
class ZapHandler {
 public:
  static absl::StatusOr<std::unique_ptr<ZapHandler>> Start(zmq::context_t& context,
                                                           std::set<std::string> authorized,
                                                           std::string name);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  uint64_t refused() const { return refused_.load(); }
  uint64_t accepted() const { return accepted_.load(); }

 private:
  ZapHandler(zmq::socket_t socket, std::set<std::string> authorized, std::string name);
  void Run();

  zmq::socket_t socket_;  // the handler thread's
  const std::set<std::string> authorized_;
  const std::string name_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> accepted_{0};
  std::thread thread_;
};

// Whether `host` (an IP address or name of a bind address) is a loopback one: 127.0.0.0/8,
// ::1, localhost.
bool IsLoopbackHost(std::string_view host);
// OK when `host` is loopback, when the listener is `authenticated` (CURVE), or when CONNEX_INSECURE
// is 1; else InvalidArgument naming `what`, the host, and the two ways out.
absl::Status CheckListenExposure(std::string_view what, std::string_view host, bool authenticated);

}  // namespace connex

#endif  // CONNEX_BASE_CURVE_H_
