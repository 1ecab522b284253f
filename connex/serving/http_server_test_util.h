// What the tests of HttpServer share (http_server_test.cc, http_server_cancel_test.cc,
// http_server_limits_test.cc): a server on a free port with an echoing or a parking handler, the
// exchanges it parks for a test to answer later, and checks that it still serves.
#ifndef CONNEX_SERVING_HTTP_SERVER_TEST_UTIL_H_
#define CONNEX_SERVING_HTTP_SERVER_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/base/wait.h"
#include "connex/serving/http_server.h"
#include "connex/serving/testing/http_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving {

using testing::Response;
using testing::TestConnection;

inline constexpr int64_t kDeadlineMs = 10'000;

// Echoes "METHOD PATH BODY" with 200.
inline void Echo(std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& r = exchange->request();
  exchange->Respond(HttpResponse{200, "text/plain", r.method + " " + r.path + " " + r.body, {}});
}

inline std::unique_ptr<HttpServer> Start(HttpServerOptions options, HttpHandler handler,
                                         InlinePredicate run_inline = nullptr) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      StartHttpServer(options, std::move(handler), std::move(run_inline));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// The OpenAI error code of an error response.
inline std::string ErrorCodeOf(const Response& response) {
  return nlohmann::json::parse(response.body())["error"]["code"].get<std::string>();
}

inline bool CanConnect(uint16_t port) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  return !ec;
}

// Exchanges a handler keeps, for a test to answer later.
class Parked {
 public:
  HttpHandler Handler() {
    return [this](std::shared_ptr<HttpExchange> exchange) {
      MutexLock lock(&mu_);
      exchanges_.push_back(std::move(exchange));
    };
  }
  size_t size() {
    MutexLock lock(&mu_);
    return exchanges_.size();
  }
  std::vector<std::shared_ptr<HttpExchange>> Take() {
    MutexLock lock(&mu_);
    return std::move(exchanges_);
  }
  // Waits for one parked exchange and takes it; null if none came.
  std::shared_ptr<HttpExchange> Await() {
    if (!WaitUntil([&] { return size() == 1; }, kDeadlineMs)) return nullptr;
    return Take()[0];
  }

 private:
  Mutex mu_;
  std::vector<std::shared_ptr<HttpExchange>> exchanges_ ABSL_GUARDED_BY(mu_);
};

// The server still answers a fresh connection (through `parked` when the handler parks).
inline void ExpectServing(HttpServer& server, Parked* parked = nullptr) {
  TestConnection c(server.port());
  ASSERT_TRUE(c.Send("GET", "/still"));
  if (parked != nullptr) {
    std::shared_ptr<HttpExchange> exchange = parked->Await();
    ASSERT_NE(exchange, nullptr);
    exchange->Respond(HttpResponse{200, "text/plain", "ok", {}});
  }
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 200u);
}

// A server that parks its requests, a client, and the exchange of the client's first request,
// whose cancellations are counted.
struct OneParked {
  explicit OneParked(HttpServerOptions options = {}, const std::string& target = "/v1/completions")
      : server(Start(options, parked.Handler())),
        client(std::make_unique<TestConnection>(server->port())) {
    if (!client->Send("POST", target, "{}")) return;
    exchange = parked.Await();
    if (exchange != nullptr) exchange->OnCancel([this] { cancels.fetch_add(1); });
  }

  Parked parked;
  std::unique_ptr<HttpServer> server;
  std::unique_ptr<TestConnection> client;
  std::shared_ptr<HttpExchange> exchange;
  std::atomic<int> cancels{0};
};
}  // namespace connex::serving

#endif  // CONNEX_SERVING_HTTP_SERVER_TEST_UTIL_H_
