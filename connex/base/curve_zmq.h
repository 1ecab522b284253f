// CURVE on ZeroMQ sockets: making a socket a CURVE server or client with a process's
// CurveSettings (curve.h), and the ZAP handler that decides which client keys a context's CURVE
// servers admit. Functions are thread-safe; a ZapHandler is one thread of its own.
#ifndef CONNEX_BASE_CURVE_ZMQ_H_
#define CONNEX_BASE_CURVE_ZMQ_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "connex/base/curve.h"
#include "zmq.hpp"

namespace connex {

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

}  // namespace connex

#endif  // CONNEX_BASE_CURVE_ZMQ_H_
