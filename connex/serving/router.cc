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

void Router::AddPrefix(std::string method, std::string prefix, HttpHandler handler) {
  prefixes_[std::move(prefix)][std::move(method)] = std::move(handler);
}

const Router::Methods* Router::Find(const std::string& path) const {
  if (auto exact = routes_.find(path); exact != routes_.end()) return &exact->second;
  const Methods* found = nullptr;
  size_t longest = 0;
  for (const auto& [prefix, methods] : prefixes_) {
    if (path.size() > prefix.size() && path.starts_with(prefix) && prefix.size() > longest) {
      found = &methods;
      longest = prefix.size();
    }
  }
  return found;
}

bool Router::IsInline(const HttpRequest& request) const {
  return inline_.count({request.method, request.path}) > 0;
}

void Router::Handle(std::shared_ptr<HttpExchange> exchange) const {
  const HttpRequest& request = exchange->request();
  const Methods* methods = Find(request.path);
  if (methods == nullptr) {
    exchange->Respond(JsonResponse(
        404, ErrorEnvelope(404, StrCat("no route for ", request.method, " ", request.path), "",
                           "not_found")));
    return;
  }
  auto route = methods->find(request.method);
  if (route == methods->end()) {
    std::string allow;
    for (const auto& [method, handler] : *methods) {
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
