// Connection: one client connection of HttpServer (http_connection.h: ConnectionHandle), a state
// machine on the server's I/O thread. Its methods sit in two rooms: its life and the reading of a
// request under its bounds, handed to the handler while a read watches for the client leaving, in
// http_connection.cc; the writing of a whole or streamed response, then keep-alive or a
// linger-close, in http_connection_write.cc. HttpExchange (http_exchange.cc) posts to it. Confined
// to the I/O thread. Private to connex_serving: it includes Boost.Beast.
#ifndef CONNEX_SERVING_INTERNAL_HTTP_CONNECTION_IMPL_H_
#define CONNEX_SERVING_INTERNAL_HTTP_CONNECTION_IMPL_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "connex/serving/http_server.h"
#include "connex/serving/internal/http_connection.h"

namespace connex::serving::internal {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

inline std::string_view View(boost::beast::string_view s) { return {s.data(), s.size()}; }

// One client connection. Every member is used on the I/O thread only.
class Connection final : public ConnectionHandle, public std::enable_shared_from_this<Connection> {
 public:
  Connection(ConnectionContext server, tcp::socket socket);
  ~Connection() override;

  void Start() override { ReadRequest(); }

  void Refuse(int limit) override;

  void OnStopping() override;

  void Abort() override { ClientGone(); }

  int64_t WaitingSinceMs() const override {
    return phase_ == Phase::kReadingHead || phase_ == Phase::kReadingBody ? waiting_since_ms_ : -1;
  }

  void Evict() override;

  // HttpExchange's requests, run on the I/O thread (http_connection_write.cc).
  void WriteResponse(HttpResponse response);

  void WriteStreamHead(int status, std::string content_type,
                       const std::vector<std::pair<std::string, std::string>>& headers);

  void WriteChunk(std::string data);  // data is not empty (HttpExchange::Send)
  void WriteLastChunk();
  // HttpExchange::KeepStreamAlive: `data` after every `every_ms` of nothing queued on the open
  // stream, while `alive()`.
  void KeepStreamAlive(int64_t every_ms, std::string data, std::function<bool()> alive);

  void ClientGone();

 private:
  enum class Phase { kReadingHead, kReadingBody, kHandling, kLingering, kClosed };
  // What a pending monitor read hands over to when it completes.
  enum class AfterMonitor { kNothing, kReadRequest, kLinger };

  struct Write {
    enum Kind { kMessage, kHead, kChunk, kLast } kind;
    std::string bytes;  // as they go on the wire (a chunk framed); empty: nothing to write
    size_t payload;     // a chunk's data, before framing (HttpExchange::Written)
    bool ends_response;
  };

  // ---- reading: http_connection.cc ----

  // Bytes of a request read, or already waiting in the socket (a request sent just before the
  // server stopped is served, not reset).
  bool ReceivedSome();

  void ArmReadDeadline(int64_t ms);
  void DisarmReadDeadline() {
    ++read_deadline_;
    read_timer_.cancel();
  }

  void ReadRequest();
  // Parses what buffer_ holds; reads more until the head (kReadingHead) or the whole request
  // (kReadingBody) is in, then OnHead or OnRequest.
  void ReadMore();
  void OnEndOfInput();
  void OnHead(ErrorCode ec);
  void OnReadError(ErrorCode ec);
  void OnRequest();
  // While the handler works, a read notices a client that closes the connection. Bytes that a
  // pipelining client sends meanwhile stay in buffer_ for the next request, up to a header's
  // worth; past that they are read and discarded and the connection closes after this response
  // (the client retries what was not answered), so that the read goes on watching: a connection
  // that ends for any reason cancels its request.
  void Monitor();
  void OnMonitor(ErrorCode ec, size_t n);

  // ---- writing and closing: http_connection_write.cc ----

  void WriteError(int status, std::string message, std::string_view code);
  // A stream's chunk as it goes on the wire (chunked, or as it is to HTTP/1.0).
  std::string Framed(std::string data) const;
  // The stream's keep-alive: armed for `every_ms` after `from`; due, it queues its chunk if
  // nothing was queued meanwhile, nothing waits to be written and the producer is alive.
  void ArmKeepAlive(std::chrono::steady_clock::time_point from);
  void OnKeepAliveDue();
  void StopKeepAlive();
  void Queue(Write write);
  void WriteNext();
  void OnWritten(ErrorCode ec);
  // Sends FIN, then reads and discards what the client still sends until it closes too (or a
  // short deadline passes), so that it reads the last response rather than a reset.
  void GracefulClose();
  void Linger();
  void Close();

  ConnectionContext server_;
  tcp::socket socket_;
  net::steady_timer read_timer_;
  net::steady_timer write_timer_;
  uint64_t read_deadline_ = 0;   // generation of the armed read deadline
  uint64_t write_deadline_ = 0;  // generation of the armed write deadline
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kReadingHead;
  bool timed_out_ = false;
  bool keep_alive_ = true;
  int64_t waiting_since_ms_ = -1;  // WaitingSinceMs
  size_t body_charge_ = 0;         // of the body being read (the exchange takes it over)
  unsigned version_ = 11;          // of the request being answered: 10 or 11
  bool chunked_ = true;            // the stream being written is chunked (not to HTTP/1.0)
  int64_t requests_ = 0;
  std::shared_ptr<HttpExchange> exchange_;
  bool response_complete_ = true;
  bool monitor_pending_ = false;
  AfterMonitor after_monitor_ = AfterMonitor::kNothing;
  std::deque<Write> writes_;
  bool writing_ = false;
  std::chrono::steady_clock::time_point last_queued_;  // of the last bytes queued
  struct StreamKeepAlive {
    std::chrono::milliseconds every;
    std::string bytes;  // the chunk as it goes on the wire
    std::function<bool()> alive;
  };
  std::optional<StreamKeepAlive> stream_keep_alive_;
  net::steady_timer keep_alive_timer_;
  uint64_t keep_alive_generation_ = 0;  // of the armed keep-alive timer
  std::array<char, 4096> discard_;
  static constexpr size_t kReadBytes = 65536;  // one read's room at most (Beast's reads' size)
};

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_HTTP_CONNECTION_IMPL_H_
