#include "connex/serving/router.h"

#include <memory>
#include <string>

#include "connex/serving/api_error.h"
#include "connex/serving/openai_response.h"
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

// A prefix route serves the paths under it (/v1/models/{id}); an exact route wins over it.
TEST(RouterTest, APrefixRouteServesThePathsUnderIt) {
  Router router;
  router.Add("GET", "/v1/models", [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(JsonResponse(200, R"({"which":"list"})"));
  });
  router.AddPrefix("GET", "/v1/models/", [](std::shared_ptr<HttpExchange> exchange) {
    nlohmann::json j = {{"id", ModelIdOfPath(exchange->request().path)}};
    exchange->Respond(JsonResponse(200, j.dump()));
  });
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      StartHttpServer(HttpServerOptions{}, router.AsHandler());
  ASSERT_TRUE(server.ok()) << server.status();
  TestConnection c((*server)->port());
  auto get = [&](const std::string& target) {
    EXPECT_TRUE(c.Send("GET", target));
    std::optional<Response> r = c.Read();
    EXPECT_TRUE(r.has_value());
    return r.has_value() ? std::make_pair(static_cast<int>(r->result_int()), r->body())
                         : std::make_pair(0, std::string());
  };
  EXPECT_EQ(get("/v1/models").second, R"({"which":"list"})");
  EXPECT_EQ(get("/v1/models/tiny").second, R"({"id":"tiny"})");
  EXPECT_EQ(get("/v1/models/meta-llama/Llama-3.2-1B?x=1").second,
            R"({"id":"meta-llama/Llama-3.2-1B"})");
  EXPECT_EQ(get("/v1/models/org%2Fname").second, R"({"id":"org/name"})");
  EXPECT_EQ(get("/v1/models/").first, 404);  // the prefix alone names no model
  EXPECT_TRUE(c.Send("POST", "/v1/models/tiny", "{}"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 405u);
  EXPECT_EQ((*r)["Allow"], "GET");
}

}  // namespace
}  // namespace connex::serving
