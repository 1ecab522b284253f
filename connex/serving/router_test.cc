#include "connex/serving/router.h"

#include <memory>
#include <string>

#include "connex/serving/api_error.h"
#include "connex/serving/testing/http_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using testing::Response;
using testing::TestConnection;

TEST(RouterTest, RoutesAnd404And405InTheOpenAiEnvelope) {
  Router router;
  router.Add("GET", "/v1/models", [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(JsonResponse(200, R"({"object":"list","data":[]})"));
  });
  router.Add("POST", "/v1/completions", [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(ErrorResponse(InvalidRequest("prompt", "invalid_type", "bad prompt")));
  });
  router.Add("GET", "/v1/completions", [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(JsonResponse(200, "{}"));
  });
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      StartHttpServer(HttpServerOptions{}, router.AsHandler());
  ASSERT_TRUE(server.ok()) << server.status();
  TestConnection c((*server)->port());

  ASSERT_TRUE(c.Send("GET", "/v1/models?verbose=1"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 200u);
  EXPECT_EQ((*r)[testing::http::field::content_type], "application/json");

  ASSERT_TRUE(c.Send("GET", "/nowhere"));
  r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 404u);
  nlohmann::json error = nlohmann::json::parse(r->body())["error"];
  EXPECT_EQ(error["code"], "not_found");
  EXPECT_EQ(error["type"], "invalid_request_error");

  ASSERT_TRUE(c.Send("DELETE", "/v1/completions"));
  r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 405u);
  EXPECT_EQ((*r)["Allow"], "GET, POST");
  EXPECT_EQ(nlohmann::json::parse(r->body())["error"]["code"], "method_not_allowed");

  ASSERT_TRUE(c.Send("POST", "/v1/completions", "{}"));
  r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 400u);
  EXPECT_EQ(nlohmann::json::parse(r->body())["error"]["param"], "prompt");
}

}  // namespace
}  // namespace connex::serving
