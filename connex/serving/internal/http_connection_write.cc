// Connection's writing (the class is internal/http_connection_impl.h): a whole response or a
// stream's head, chunks and end (unchunked to HTTP/1.0), queued and written one at a time under
// the write deadline; then the next request on a kept-alive connection, or a graceful close that
// lingers reading until the client closes too, so that it reads the last response.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "connex/serving/api_error.h"
#include "connex/serving/internal/http_connection_impl.h"

namespace connex::serving::internal {

void Connection::WriteResponse(HttpResponse response) {
  auto message = std::make_shared<http::response<http::string_body>>();
  message->result(static_cast<unsigned>(response.status));
  message->version(version_);
  message->set(http::field::server, "connex");
  message->set(http::field::content_type, response.content_type);
  for (auto& [name, value] : response.headers) message->set(name, value);
  message->body() = std::move(response.body);
  message->keep_alive(keep_alive_ && !server_.stopping());
  message->prepare_payload();
  keep_alive_ = message->keep_alive();
  Queue(Write{Write::kMessage, std::move(message), {}, /*ends_response=*/true});
}

void Connection::WriteStreamHead(int status, std::string content_type,
                                 const std::vector<std::pair<std::string, std::string>>& headers) {
  stream_head_ = {};
  stream_head_.result(static_cast<unsigned>(status));
  stream_head_.version(version_);
  stream_head_.set(http::field::server, "connex");
  stream_head_.set(http::field::content_type, content_type);
  stream_head_.set(http::field::cache_control, "no-cache");
  for (const auto& [name, value] : headers) stream_head_.set(name, value);
  // HTTP/1.0 has no chunked encoding: the stream is the body as it comes, ended by the close.
  chunked_ = version_ >= 11;
  stream_head_.keep_alive(chunked_ && keep_alive_ && !server_.stopping());
  if (chunked_) stream_head_.chunked(true);
  keep_alive_ = stream_head_.keep_alive();
  Queue(Write{Write::kHead, nullptr, {}, false});
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
  Write& write = writes_.front();
  switch (write.kind) {
    case Write::kMessage:
      http::async_write(socket_, *write.message, std::move(done));
      break;
    case Write::kHead:
      stream_serializer_.emplace(stream_head_);
      http::async_write_header(socket_, *stream_serializer_, std::move(done));
      break;
    case Write::kChunk:
      if (!chunked_) {
        net::async_write(socket_, net::buffer(write.data), std::move(done));
        break;
      }
      net::async_write(socket_, http::make_chunk(net::buffer(write.data)), std::move(done));
      break;
    case Write::kLast:
      if (!chunked_) {  // nothing to write: the close ends an HTTP/1.0 stream
        net::post(socket_.get_executor(),
                  [done = std::move(done)]() mutable { done(ErrorCode{}, 0); });
        break;
      }
      net::async_write(socket_, http::make_chunk_last(), std::move(done));
      break;
  }
}

void Connection::OnWritten(ErrorCode ec) {
  writing_ = false;
  ++write_deadline_;
  write_timer_.cancel();
  if (phase_ == Phase::kClosed) return;
  if (ec) return ClientGone();
  Write write = std::move(writes_.front());
  writes_.pop_front();
  if (write.kind == Write::kChunk && exchange_ != nullptr) exchange_->Written(write.data.size());
  if (!write.ends_response) return WriteNext();
  response_complete_ = true;
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
}

}  // namespace connex::serving::internal
