// Feeding Beast's HTTP response parser (sans I/O) from a byte buffer: the one loop behind both
// HTTP clients, the blocking one (serving/http_client.h) and the proxy's asynchronous upstream
// call (internal/upstream.h), which differ only in how the bytes arrive.
#ifndef CONNEX_SERVING_INTERNAL_RESPONSE_PARSER_H_
#define CONNEX_SERVING_INTERNAL_RESPONSE_PARSER_H_

#include <string>

#include "absl/status/status.h"
#include "boost/asio/buffer.hpp"
#include "boost/beast/http/error.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/string_body.hpp"
#include "connex/base/strings.h"

namespace connex::serving::internal {

using ResponseParser = boost::beast::http::response_parser<boost::beast::http::string_body>;

// Gives `parser` what it can take of `input` (erased as taken): Beast's parser stops after each
// element (the head, a chunk), so it is fed until it wants more bytes or is done. When the
// connection has ended (`eof`) and every byte was taken, a body delimited by the connection's end
// is ended. Errors (Unavailable): bytes that are not an HTTP response, the connection ended
// before the head or inside a delimited body.
inline absl::Status FeedResponseParser(ResponseParser& parser, std::string& input, bool eof) {
  while (!input.empty() && !parser.is_done()) {
    boost::system::error_code ec;
    const size_t used = parser.put(boost::asio::buffer(input.data(), input.size()), ec);
    input.erase(0, used);
    if (ec == boost::beast::http::error::need_more) break;
    if (ec) return absl::UnavailableError(StrCat("not an HTTP response: ", ec.message()));
    if (used == 0) break;
  }
  if (eof && input.empty() && !parser.is_done()) {
    if (!parser.is_header_done()) {
      return absl::UnavailableError("the connection ended before the response's head");
    }
    boost::system::error_code ec;
    parser.put_eof(ec);  // ends a body delimited by the connection's end
    if (ec) return absl::UnavailableError("the connection ended in the middle of the body");
  }
  return absl::OkStatus();
}

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_RESPONSE_PARSER_H_
