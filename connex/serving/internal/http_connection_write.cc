// Connection's writing (the class is internal/http_connection_impl.h): a whole response or a
// stream's head, chunks and end (unchunked to HTTP/1.0), as bytes queued and written one at a time
// under the write deadline; then the next request on a kept-alive connection, or a graceful close
// that lingers reading until the client closes too, so that it reads the last response.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "connex/serving/internal/http_connection_impl.h"
#include "fmt/format.h"

namespace connex::serving::internal {
namespace {

// A response's head as bytes: the status line, then the fields in order, a field set again
// replacing the earlier one of that name (case aside), as Beast's fields::set does. The writes
// are plain bytes on the socket: Beast's composed write operations cost this file most of its
// compile time for what a head, a length and chunk framing are.
class ResponseHead {
 public:
  ResponseHead(int status, unsigned version) : status_(status), version_(version) {}

  void Set(std::string_view name, std::string_view value) {
    std::erase_if(fields_, [&](const auto& f) {
      return absl::EqualsIgnoreCase(AsAbsl(f.first), AsAbsl(name));
    });
    fields_.emplace_back(Clean(name), Clean(value));
  }

  // Beast's keep_alive(): HTTP/1.1 says only "close", HTTP/1.0 only "keep-alive".
  void KeepAlive(bool keep_alive) {
    if (version_ >= 11 && !keep_alive) Set("Connection", "close");
    if (version_ < 11 && keep_alive) Set("Connection", "keep-alive");
  }

  std::string Bytes() const {
    std::string out = StrCat("HTTP/1.", version_ >= 11 ? "1" : "0", " ", status_, " ",
                             View(http::obsolete_reason(http::int_to_status(status_))), "\r\n");
    for (const auto& [name, value] : fields_) out += StrCat(name, ": ", value, "\r\n");
    out += "\r\n";
    return out;
  }

 private:
  // A handler's header cannot split the head: CR and LF become spaces.
  static std::string Clean(std::string_view text) {
    std::string out(text);
    std::replace_if(
        out.begin(), out.end(), [](char c) { return c == '\r' || c == '\n'; }, ' ');
    return out;
  }

  int status_;
  unsigned version_;
  std::vector<std::pair<std::string, std::string>> fields_;
};

// 1xx, 204 and 304 answers have no body, and so no Content-Length.
bool MayHaveBody(int status) { return status >= 200 && status != 204 && status != 304; }

}  // namespace

void Connection::WriteResponse(HttpResponse response) {
  ResponseHead head(response.status, version_);
  head.Set("Server", "connex");
  head.Set("Content-Type", response.content_type);
  for (const auto& [name, value] : response.headers) head.Set(name, value);
  keep_alive_ = keep_alive_ && !server_.stopping();
  head.KeepAlive(keep_alive_);
  if (MayHaveBody(response.status)) {
    head.Set("Content-Length", std::to_string(response.body.size()));
  } else {
    response.body.clear();
  }
  std::string bytes = head.Bytes();
  bytes += response.body;
  Queue(Write{Write::kMessage, std::move(bytes), 0, /*ends_response=*/true});
}

void Connection::WriteStreamHead(int status, std::string content_type,
                                 const std::vector<std::pair<std::string, std::string>>& headers) {
  ResponseHead head(status, version_);
  head.Set("Server", "connex");
  head.Set("Content-Type", content_type);
  head.Set("Cache-Control", "no-cache");
  for (const auto& [name, value] : headers) head.Set(name, value);
  // HTTP/1.0 has no chunked encoding: the stream is the body as it comes, ended by the close.
  chunked_ = version_ >= 11;
  keep_alive_ = chunked_ && keep_alive_ && !server_.stopping();
  head.KeepAlive(keep_alive_);
  if (chunked_) head.Set("Transfer-Encoding", "chunked");
  Queue(Write{Write::kHead, head.Bytes(), 0, false});
}

std::string Connection::Framed(std::string data) const {
  return chunked_ ? fmt::format("{:x}\r\n{}\r\n", data.size(), data) : data;
}

void Connection::WriteChunk(std::string data) {
  const size_t payload = data.size();
  Queue(Write{Write::kChunk, Framed(std::move(data)), payload, false});
}

void Connection::WriteLastChunk() {
  StopKeepAlive();
  // Nothing to write to HTTP/1.0: the close ends its stream.
  Queue(Write{Write::kLast, chunked_ ? "0\r\n\r\n" : "", 0, true});
}

void Connection::KeepStreamAlive(int64_t every_ms, std::string data, std::function<bool()> alive) {
  if (phase_ == Phase::kClosed || response_complete_ || exchange_ == nullptr) return;
  stream_keep_alive_ = StreamKeepAlive{std::chrono::milliseconds(every_ms), Framed(std::move(data)),
                                       std::move(alive)};
  ArmKeepAlive(last_queued_);
}

void Connection::ArmKeepAlive(std::chrono::steady_clock::time_point from) {
  const uint64_t generation = ++keep_alive_generation_;
  keep_alive_timer_.expires_at(from + stream_keep_alive_->every);
  keep_alive_timer_.async_wait([self = shared_from_this(), generation](ErrorCode ec) {
    if (ec || generation != self->keep_alive_generation_) return;
    self->OnKeepAliveDue();
  });
}

void Connection::OnKeepAliveDue() {
  if (!stream_keep_alive_ || phase_ == Phase::kClosed || response_complete_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < last_queued_ + stream_keep_alive_->every) return ArmKeepAlive(last_queued_);
  // A client that has not read what was queued needs no more; a producer that is not alive
  // gets none (the reader's idle timeout is then right to give up on it).
  if (!writes_.empty() || !stream_keep_alive_->alive()) return ArmKeepAlive(now);
  Queue(Write{Write::kChunk, stream_keep_alive_->bytes, 0, false});
  ArmKeepAlive(last_queued_);
}

void Connection::StopKeepAlive() {
  if (!stream_keep_alive_) return;
  stream_keep_alive_.reset();
  ++keep_alive_generation_;
  keep_alive_timer_.cancel();
}

void Connection::WriteError(int status, std::string message, std::string_view code) {
  keep_alive_ = false;
  phase_ = Phase::kHandling;
  response_complete_ = false;
  WriteResponse(
      HttpResponse{status, "application/json", ErrorEnvelope(status, message, "", code), {}});
}

void Connection::Queue(Write write) {
  if (phase_ == Phase::kClosed) return;
  last_queued_ = std::chrono::steady_clock::now();
  writes_.push_back(std::move(write));
  WriteNext();
}

void Connection::WriteNext() {
  if (writing_ || writes_.empty() || phase_ == Phase::kClosed) return;
  writing_ = true;
  uint64_t generation = ++write_deadline_;
  write_timer_.expires_after(std::chrono::milliseconds(server_.options.write_timeout_ms));
  write_timer_.async_wait([self = shared_from_this(), generation](ErrorCode ec) {
    if (ec || generation != self->write_deadline_) return;
    self->ClientGone();  // reads too slowly
  });
  auto done = [self = shared_from_this()](ErrorCode ec, size_t) { self->OnWritten(ec); };
  const std::string& bytes = writes_.front().bytes;
  if (bytes.empty()) {  // the end of an HTTP/1.0 stream
    net::post(socket_.get_executor(), [done = std::move(done)]() mutable { done(ErrorCode{}, 0); });
    return;
  }
  net::async_write(socket_, net::buffer(bytes), std::move(done));
}

void Connection::OnWritten(ErrorCode ec) {
  writing_ = false;
  ++write_deadline_;
  write_timer_.cancel();
  if (phase_ == Phase::kClosed) return;
  if (ec) return ClientGone();
  Write write = std::move(writes_.front());
  writes_.pop_front();
  if (write.kind == Write::kChunk && exchange_ != nullptr) exchange_->Written(write.payload);
  if (!write.ends_response) return WriteNext();
  response_complete_ = true;
  StopKeepAlive();
  exchange_.reset();
  writes_.clear();
  if (!keep_alive_ || server_.stopping()) return GracefulClose();
  if (monitor_pending_) {
    after_monitor_ = AfterMonitor::kReadRequest;
    ErrorCode ignored;
    socket_.cancel(ignored);
    return;
  }
  ReadRequest();
}

void Connection::GracefulClose() {
  ErrorCode ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  if (monitor_pending_) {
    after_monitor_ = AfterMonitor::kLinger;
    socket_.cancel(ignored);
    return;
  }
  Linger();
}

void Connection::Linger() {
  if (phase_ != Phase::kLingering) {
    phase_ = Phase::kLingering;
    ArmReadDeadline(std::min(kMaxLingerMs, server_.options.read_timeout_ms));
  }
  socket_.async_read_some(net::buffer(discard_), [self = shared_from_this()](ErrorCode ec, size_t) {
    if (self->phase_ == Phase::kClosed) return;
    if (ec) return self->Close();
    self->Linger();
  });
}

void Connection::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  ErrorCode ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  DisarmReadDeadline();
  ++write_deadline_;
  write_timer_.cancel();
  StopKeepAlive();
}

}  // namespace connex::serving::internal
