// Router: maps a request's method and path (exact match, else the longest prefix route; query
// ignored) to a handler. A path it does not know is a 404, a known path with another method a 405
// with `Allow`, both in the OpenAI error envelope. Routes are added before serving; Handle is
// then thread-safe (the table is read-only), so one Router can be the HttpServer's handler.
#ifndef CONNEX_SERVING_ROUTER_H_
#define CONNEX_SERVING_ROUTER_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "connex/serving/http_server.h"

namespace connex::serving {

class Router {
 public:
  // Adds `handler` for `method` (e.g. "GET") on `path` (e.g. "/v1/models"), replacing an earlier
  // one for the same pair.
  void Add(std::string method, std::string path, HttpHandler handler);
  // The same for a handler that answers at once and never blocks: the server runs it on its I/O
  // thread (InlinePredicate), so that it answers however busy the handler threads are.
  void AddInline(std::string method, std::string path, HttpHandler handler);
  // `handler` for `method` on every path that starts with `prefix` and goes on (e.g.
  // "/v1/models/" for /v1/models/{id}: the handler reads the rest of the path). An exact route
  // wins over a prefix route, a longer prefix over a shorter one.
  void AddPrefix(std::string method, std::string prefix, HttpHandler handler);
  // Whether `request` goes to an AddInline handler.
  bool IsInline(const HttpRequest& request) const;

  void Handle(std::shared_ptr<HttpExchange> exchange) const;

  // A handler that forwards to this router, which must outlive the server using it.
  HttpHandler AsHandler() const {
    return [this](std::shared_ptr<HttpExchange> exchange) { Handle(std::move(exchange)); };
  }
  // IsInline as the server's InlinePredicate; this router must outlive the server.
  InlinePredicate AsInlinePredicate() const {
    return [this](const HttpRequest& request) { return IsInline(request); };
  }

 private:
  using Methods = std::map<std::string, HttpHandler>;  // method -> handler
  // The routes of `path`: its exact ones, else those of its longest prefix; nullptr for none.
  const Methods* Find(const std::string& path) const;

  std::map<std::string, Methods> routes_;                 // path -> method -> handler
  std::map<std::string, Methods> prefixes_;               // prefix -> method -> handler
  std::set<std::pair<std::string, std::string>> inline_;  // (method, path)
};

// A JSON response with `status`.
HttpResponse JsonResponse(int status, std::string body);
// The error response of a failed request: HttpStatusOf and ErrorEnvelope (api_error.h).
HttpResponse ErrorResponse(const absl::Status& status);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_ROUTER_H_
