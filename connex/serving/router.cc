#include "connex/serving/router.h"

#include "connex/base/strings.h"
#include "connex/serving/api_error.h"

namespace connex::serving {

void Router::Add(std::string method, std::string path, HttpHandler handler) {
  inline_.erase({method, path});
  routes_[std::move(path)][std::move(method)] = std::move(handler);
}

void Router::AddInline(std::string method, std::string path, HttpHandler handler) {
  inline_.insert({method, path});
  routes_[std::move(path)][std::move(method)] = std::move(handler);
}

bool Router::IsInline(const HttpRequest& request) const {
  return inline_.count({request.method, request.path}) > 0;
}

void Router::Handle(std::shared_ptr<HttpExchange> exchange) const {
  const HttpRequest& request = exchange->request();
  auto path = routes_.find(request.path);
  if (path == routes_.end()) {
    exchange->Respond(JsonResponse(
        404, ErrorEnvelope(404, StrCat("no route for ", request.method, " ", request.path), "",
                           "not_found")));
    return;
  }
  auto route = path->second.find(request.method);
  if (route == path->second.end()) {
    std::string allow;
    for (const auto& [method, handler] : path->second) {
      if (!allow.empty()) allow += ", ";
      allow += method;
    }
    HttpResponse response = JsonResponse(
        405, ErrorEnvelope(405, StrCat(request.path, " takes ", allow, ", not ", request.method),
                           "", "method_not_allowed"));
    response.headers.emplace_back("Allow", allow);
    exchange->Respond(std::move(response));
    return;
  }
  route->second(std::move(exchange));
}

HttpResponse JsonResponse(int status, std::string body) {
  return HttpResponse{status, "application/json", std::move(body), {}};
}

HttpResponse ErrorResponse(const absl::Status& status) {
  return JsonResponse(HttpStatusOf(status), ErrorEnvelope(status));
}

}  // namespace connex::serving
