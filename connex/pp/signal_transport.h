// SignalTransport: carries the step protocol's small control messages (step signals,
// acknowledgements, results) between endpoints, addressed by a self-describing address that the
// endpoint publishes in the directory. Delivery is best effort: a message may be lost, delayed
// or (on the mem fake) duplicated; the protocol copes with all three. The payloads themselves go
// through the TransferEngine, not here.
//
// Implementations are thread-safe. The receiver callback runs on the transport's own thread.
#ifndef CONNEX_PP_SIGNAL_TRANSPORT_H_
#define CONNEX_PP_SIGNAL_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "connex/base/curve.h"

namespace connex::pp {

// Every signal address starts with it (`pp+tcp://`, `pp+mem://`): it tells a record's signal
// address from its transport addresses.
inline constexpr std::string_view kSignalScheme = "pp+";

class SignalTransport {
 public:
  using Receiver = std::function<void(std::string frame)>;
  virtual ~SignalTransport() = default;

  // The address peers send to (`pp+tcp://HOST:PORT`, `pp+mem://N`).
  virtual const std::string& address() const = 0;
  // Where inbound frames go. Set once, before any peer knows the address.
  virtual void SetReceiver(Receiver receiver) = 0;
  // Queues `frame` for `address`; never blocks on the network. Unknown or unreachable addresses
  // lose the frame, as the network would.
  virtual void Send(const std::string& address, std::string frame) = 0;
  // `address` is gone (its incarnation failed): a connection kept for it may be closed. A later
  // Send to it connects again.
  virtual void Forget(const std::string& address) { (void)address; }
  // Stops receiving and sending; inbound frames are dropped from then on.
  virtual void Close() = 0;
  // Connections its receiving socket refused for their credentials (a CURVE key not authorized).
  virtual uint64_t connections_refused() const { return 0; }
};

// A ZeroMQ transport bound on `host` at a free port (`pp+tcp://HOST:PORT`): a ROUTER receives,
// one DEALER per destination sends; one I/O thread owns every socket. With a CURVE key pair in
// `curve` the ROUTER is a CURVE server admitting `curve.authorized` only, its address carries its
// public key (`...?curve=HEX`), and it sends only to peers that use CURVE too (and vice versa).
// InvalidArgument for a non-loopback `host` without CURVE unless CONNEX_INSECURE=1.
absl::StatusOr<std::unique_ptr<SignalTransport>> CreateZmqSignalTransport(
    const std::string& host = "127.0.0.1", const CurveSettings& curve = {});

}  // namespace connex::pp

#endif  // CONNEX_PP_SIGNAL_TRANSPORT_H_
