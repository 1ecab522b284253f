// A blocking HTTP client for the serving tests, on Beast over plain Asio sockets: whole requests,
// raw bytes (for malformed input), and reads that give up after a bound instead of hanging a
// test. Thread-compatible; each TestConnection is used by one thread.
#ifndef CONNEX_SERVING_TESTING_HTTP_CLIENT_H_
#define CONNEX_SERVING_TESTING_HTTP_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace connex::serving::testing {

namespace http = boost::beast::http;
using Response = http::response<http::string_body>;

class TestConnection {
 public:
  // Connects to 127.0.0.1:`port`; every blocking read gives up after `read_bound_ms`.
  explicit TestConnection(uint16_t port, int read_bound_ms = 10'000)
      : socket_(io_), read_bound_(read_bound_ms) {
    socket_.connect({boost::asio::ip::make_address("127.0.0.1"), port});
  }

  // Writes `bytes` as they are; false when the connection is broken.
  bool SendRaw(const std::string& bytes) {
    boost::system::error_code ec;
    boost::asio::write(socket_, boost::asio::buffer(bytes), ec);
    return !ec;
  }

  bool Send(const std::string& method, const std::string& target, const std::string& body = "",
            const std::string& extra_headers = "") {
    std::string request = method + " " + target + " HTTP/1.1\r\nHost: test\r\n" + extra_headers;
    if (!body.empty() || method == "POST") {
      request +=
          "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\n";
    }
    return SendRaw(request + "\r\n" + body);
  }

  // The next whole response, or nullopt when the connection closed (or the bound passed) first.
  std::optional<Response> Read() {
    Response response;
    boost::system::error_code ec =
        Bounded([&](auto done) { http::async_read(socket_, buffer_, response, std::move(done)); });
    if (ec) return std::nullopt;
    return response;
  }

  // For streams: reads the head, then body bytes as they come.
  bool ReadHead() {
    return !Bounded(
        [&](auto done) { http::async_read_header(socket_, buffer_, parser_, std::move(done)); });
  }
  // Reads until the streamed body so far contains `needle`; false when it ended or broke first.
  bool ReadUntil(const std::string& needle) {
    while (parser_.get().body().find(needle) == std::string::npos) {
      if (parser_.is_done()) return false;
      boost::system::error_code ec = Bounded(
          [&](auto done) { http::async_read_some(socket_, buffer_, parser_, std::move(done)); });
      if (ec) return false;
    }
    return true;
  }
  // Reads whatever comes next of a streamed body (at least one byte); false when it ended or broke.
  bool ReadSome() {
    if (parser_.is_done()) return false;
    return !Bounded(
        [&](auto done) { http::async_read_some(socket_, buffer_, parser_, std::move(done)); });
  }
  // Reads the rest of a streamed response.
  bool ReadToEnd() {
    return !Bounded(
        [&](auto done) { http::async_read(socket_, buffer_, parser_, std::move(done)); });
  }
  http::response_parser<http::string_body>& parser() { return parser_; }

  // True when the server closed the connection (a read sees EOF or a reset within the bound).
  bool ClosedByPeer() {
    char byte;
    boost::system::error_code ec = Bounded([&](auto done) {
      socket_.async_read_some(boost::asio::buffer(&byte, 1), std::move(done));
    });
    return ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset;
  }

  void Close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

 private:
  // Runs the asynchronous operation `start(handler)` for at most the read bound; a read still
  // pending then is cancelled and reported as timed_out.
  template <typename Start>
  boost::system::error_code Bounded(Start start) {
    boost::system::error_code result = boost::asio::error::timed_out;
    bool done = false;
    start([&](boost::system::error_code ec, size_t) {
      done = true;
      if (result == boost::asio::error::timed_out) result = ec;
    });
    io_.restart();
    io_.run_for(std::chrono::milliseconds(read_bound_));
    if (!done) {
      boost::system::error_code ignored;
      socket_.cancel(ignored);
      io_.restart();
      io_.run();
      result = boost::asio::error::timed_out;
    }
    return result;
  }

  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  const int read_bound_;
};

}  // namespace connex::serving::testing

#endif  // CONNEX_SERVING_TESTING_HTTP_CLIENT_H_
