#include "connex/base/curve.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "connex/base/config.h"
#include "connex/base/curve_zmq.h"
#include "connex/base/logging.h"
#include "connex/base/secret_file.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "zmq.h"

namespace connex {
namespace {

constexpr size_t kZ85KeyLength = 40;
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr char kZapDomain[] = "connex";
// Refusals logged per handler before it only counts them (a scan must not flood the log).
constexpr uint64_t kRefusalsLogged = 20;

}  // namespace

absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[kZ85KeyLength + 1];
  char sec[kZ85KeyLength + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::FailedPreconditionError(
        StrCat("CURVE key generation failed: ", zmq_strerror(zmq_errno()),
               " (is libzmq built with CURVE support?)"));
  }
  return CurveKeyPair{pub, sec};
}

absl::Status ValidateCurveKey(std::string_view z85, std::string_view what) {
  if (z85.size() != kZ85KeyLength) {
    return absl::InvalidArgumentError(
        StrCat(what, ": a CURVE key is ", kZ85KeyLength, " Z85 characters, this is ", z85.size()));
  }
  uint8_t raw[32];
  std::string text(z85);
  if (zmq_z85_decode(raw, text.c_str()) == nullptr) {
    return absl::InvalidArgumentError(StrCat(what, ": not Z85 text"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CurveKeyPair> LoadCurveKeyFile(const std::string& path) {
  CONNEX_ASSIGN_OR_RETURN(std::string secret, ReadSecretFile(path));
  CONNEX_RETURN_IF_ERROR(ValidateCurveKey(secret, StrCat("CURVE key file '", path, "'")));
  char pub[kZ85KeyLength + 1];
  if (zmq_curve_public(pub, secret.c_str()) != 0) {
    return absl::InvalidArgumentError(StrCat(
        "CURVE key file '", path, "': cannot derive its public key: ", zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{pub, secret};
}

absl::Status WriteCurveKeyFiles(const std::string& prefix, const CurveKeyPair& keys) {
  const std::string secret_path = prefix + ".key";
  const std::string public_path = prefix + ".pub";
  int fd = open(secret_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        StrCat("cannot create '", secret_path, "': ", std::strerror(errno),
               errno == EEXIST ? " (keys are never overwritten; remove it first)" : ""));
  }
  std::string line = keys.secret_key + "\n";
  bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ok = (fsync(fd) == 0) && ok;
  close(fd);
  if (!ok) return absl::InternalError(StrCat("writing '", secret_path, "' failed"));
  std::ofstream out(public_path, std::ios::trunc);
  out << keys.public_key << "\n";
  out.close();
  if (!out) return absl::InternalError(StrCat("writing '", public_path, "' failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> LoadAuthorizedKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        StrCat("authorized keys file '", path, "': ", std::strerror(errno)));
  }
  std::set<std::string> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    size_t end = line.find_last_not_of(" \t\r");
    std::string key = line.substr(begin, end - begin + 1);
    CONNEX_RETURN_IF_ERROR(
        ValidateCurveKey(key, StrCat("authorized keys file '", path, "' line ", number)));
    keys.insert(std::move(key));
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        StrCat("authorized keys file '", path, "' lists no key: nobody could connect"));
  }
  return keys;
}

std::string CurveKeyToHex(std::string_view z85) {
  uint8_t raw[32];
  std::string text(z85);
  if (zmq_z85_decode(raw, text.c_str()) == nullptr) return "";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : raw) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::StatusOr<std::string> CurveKeyFromHex(std::string_view hex) {
  if (hex.size() != 64) {
    return absl::InvalidArgumentError(
        StrCat("CURVE key in hex: 64 digits expected, got ", hex.size()));
  }
  uint8_t raw[32];
  for (size_t i = 0; i < 32; ++i) {
    int v = 0;
    for (char c : hex.substr(2 * i, 2)) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return absl::InvalidArgumentError("CURVE key in hex: not a hex digit");
      v = v * 16 + d;
    }
    raw[i] = static_cast<uint8_t>(v);
  }
  char z85[kZ85KeyLength + 1];
  if (zmq_z85_encode(z85, raw, sizeof(raw)) == nullptr) {
    return absl::InternalError("CURVE key: Z85 encoding failed");
  }
  return std::string(z85);
}

absl::StatusOr<CurveSettings> CurveSettings::FromEnv() {
  CurveSettings s;
  std::string key_file = EnvString("CONNEX_CURVE_KEY_FILE", "");
  std::string authorized_file = EnvString("CONNEX_CURVE_AUTHORIZED_KEYS_FILE", "");
  std::string directory_key = EnvString("CONNEX_DIRECTORY_SERVER_KEY", "");
  if (key_file.empty()) {
    if (!authorized_file.empty() || !directory_key.empty()) {
      return absl::InvalidArgumentError(
          "CONNEX_CURVE_AUTHORIZED_KEYS_FILE or CONNEX_DIRECTORY_SERVER_KEY is set but "
          "CONNEX_CURVE_KEY_FILE is not: CURVE needs this process's own key pair");
    }
    return s;
  }
  absl::StatusOr<CurveKeyPair> keys = LoadCurveKeyFile(key_file);
  if (!keys.ok()) return Annotate(keys.status(), "CONNEX_CURVE_KEY_FILE");
  s.keys = *std::move(keys);
  if (authorized_file.empty()) {
    s.authorized = {s.keys->public_key};
  } else {
    absl::StatusOr<std::set<std::string>> authorized = LoadAuthorizedKeys(authorized_file);
    if (!authorized.ok()) return Annotate(authorized.status(), "CONNEX_CURVE_AUTHORIZED_KEYS_FILE");
    s.authorized = *std::move(authorized);
  }
  if (directory_key.empty()) {
    s.directory_key = s.keys->public_key;
  } else {
    CONNEX_RETURN_IF_ERROR(ValidateCurveKey(directory_key, "CONNEX_DIRECTORY_SERVER_KEY"));
    s.directory_key = directory_key;
  }
  return s;
}

CurveSettings CurveSettings::Shared(const CurveKeyPair& keys) {
  CurveSettings s;
  s.keys = keys;
  s.authorized = {keys.public_key};
  s.directory_key = keys.public_key;
  return s;
}

void MakeCurveServer(zmq::socket_t& socket, const CurveSettings& settings) {
  if (!settings.enabled()) return;
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, settings.keys->secret_key);
  socket.set(zmq::sockopt::zap_domain, kZapDomain);
}

void MakeCurveClient(zmq::socket_t& socket, const CurveSettings& settings,
                     std::string_view server_key) {
  if (!settings.enabled()) return;
  socket.set(zmq::sockopt::curve_serverkey, std::string(server_key));
  socket.set(zmq::sockopt::curve_publickey, settings.keys->public_key);
  socket.set(zmq::sockopt::curve_secretkey, settings.keys->secret_key);
}

absl::StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Start(zmq::context_t& context,
                                                              std::set<std::string> authorized,
                                                              std::string name) {
  try {
    zmq::socket_t socket(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind(kZapEndpoint);
    return std::unique_ptr<ZapHandler>(
        new ZapHandler(std::move(socket), std::move(authorized), std::move(name)));
  } catch (const zmq::error_t& e) {
    return absl::FailedPreconditionError(
        StrCat(name, ": cannot start the CURVE authenticator: ", e.what()));
  }
}

ZapHandler::ZapHandler(zmq::socket_t socket, std::set<std::string> authorized, std::string name)
    : socket_(std::move(socket)), authorized_(std::move(authorized)), name_(std::move(name)) {
  thread_ = std::thread([this] { Run(); });
}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::Run() {
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      // A ZAP request: version, request id, domain, address, identity, mechanism, credentials.
      std::vector<zmq::message_t> parts;
      do {
        parts.emplace_back();
        if (!socket_.recv(parts.back(), zmq::recv_flags::dontwait)) break;
      } while (parts.back().more());
      std::string version = parts.size() > 0 ? parts[0].to_string() : "";
      std::string request_id = parts.size() > 1 ? parts[1].to_string() : "";
      std::string address = parts.size() > 3 ? parts[3].to_string() : "?";
      std::string mechanism = parts.size() > 5 ? parts[5].to_string() : "";
      std::string status = "400";
      std::string text = "refused";
      std::string user;
      if (version == "1.0" && mechanism == "CURVE" && parts.size() >= 7 && parts[6].size() == 32) {
        char z85[kZ85KeyLength + 1];
        zmq_z85_encode(z85, static_cast<const uint8_t*>(parts[6].data()), 32);
        if (authorized_.count(z85) != 0) {
          status = "200";
          text = "OK";
          user = z85;
        } else {
          text = "CURVE client key not authorized";
          uint64_t n = refused_.fetch_add(1) + 1;
          if (n <= kRefusalsLogged) {
            CONNEX_LOG_WARN(
                "{}: refused a connection from {}: its CURVE key {} is not authorized{}", name_,
                address, z85, n == kRefusalsLogged ? " (further refusals are only counted)" : "");
          }
        }
      } else {
        uint64_t n = refused_.fetch_add(1) + 1;
        if (n <= kRefusalsLogged) {
          CONNEX_LOG_WARN("{}: refused a connection from {}: mechanism '{}' (CURVE required)",
                          name_, address, mechanism);
        }
      }
      if (status == "200") accepted_.fetch_add(1);
      socket_.send(zmq::buffer(std::string("1.0")), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(status), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(text), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(user), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(std::string()), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      if (e.num() == EINTR) continue;
      CONNEX_LOG_ERROR("{}: CURVE authenticator: {}", name_, e.what());
      return;
    }
  }
  socket_.close();
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost") return true;
  std::string text(host);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

absl::Status CheckListenExposure(std::string_view what, std::string_view host, bool authenticated) {
  if (IsLoopbackHost(host) || authenticated) return absl::OkStatus();
  absl::StatusOr<bool> insecure = EnvBool("CONNEX_INSECURE", false);
  if (!insecure.ok()) return insecure.status();
  if (*insecure) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(
      what, ": refusing to listen on '", host,
      "' (not a loopback address) without authentication: give this process a CURVE key pair "
      "(CONNEX_CURVE_KEY_FILE, see `connexctl keygen`) where the listener supports it, or accept "
      "the exposure with --insecure (CONNEX_INSECURE=1) on a network you trust"));
}

}  // namespace connex
