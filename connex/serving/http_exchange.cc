// HttpExchange (http_server.h): what a handler holds of one request — the request, its answer
// (a whole response, or a stream of chunks bounded by max_pending_write_bytes), its cancellation
// — thread-safe, each answer posted to its connection on the server's I/O thread.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "connex/serving/http_server.h"
#include "connex/serving/internal/http_connection.h"
#include "connex/serving/internal/http_connection_impl.h"

namespace connex::serving {

HttpExchange::HttpExchange(Passkey, std::shared_ptr<internal::ServerCore> core,
                           std::weak_ptr<internal::Connection> connection, HttpRequest request,
                           size_t max_pending_write_bytes, size_t body_charge)
    : core_(std::move(core)),
      connection_(std::move(connection)),
      request_(std::move(request)),
      max_pending_write_bytes_(max_pending_write_bytes),
      body_charge_(body_charge) {}

HttpExchange::~HttpExchange() { core_->ReleaseBody(body_charge_); }

bool HttpExchange::Post(std::function<void(internal::Connection&)> op) {
  // The connection is locked on the I/O thread, so it is only ever destroyed there.
  return core_->Post([connection = connection_, op = std::move(op)] {
    if (std::shared_ptr<internal::Connection> c = connection.lock()) op(*c);
  });
}

bool HttpExchange::cancelled() const {
  MutexLock lock(&mu_);
  return cancelled_;
}

void HttpExchange::OnCancel(std::function<void()> on_cancel) {
  {
    MutexLock lock(&mu_);
    if (!cancelled_) {
      on_cancel_ = std::move(on_cancel);
      return;
    }
  }
  on_cancel();
}

void HttpExchange::Cancel() {
  std::function<void()> on_cancel;
  {
    MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    on_cancel = std::move(on_cancel_);
  }
  core_->cancelled.fetch_add(1);
  if (on_cancel) on_cancel();
}

void HttpExchange::Written(size_t bytes) {
  MutexLock lock(&mu_);
  pending_bytes_ -= std::min(bytes, pending_bytes_);
}

bool HttpExchange::Respond(HttpResponse response) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kNew || cancelled_) return false;
    state_ = State::kDone;
  }
  return Post([response = std::move(response)](internal::Connection& c) mutable {
    c.WriteResponse(std::move(response));
  });
}

bool HttpExchange::StartStream(int status, std::string content_type,
                               std::vector<std::pair<std::string, std::string>> headers) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kNew || cancelled_) return false;
    state_ = State::kStreaming;
  }
  return Post([status, content_type = std::move(content_type),
               headers = std::move(headers)](internal::Connection& c) mutable {
    c.WriteStreamHead(status, std::move(content_type), headers);
  });
}

bool HttpExchange::Send(std::string data) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kStreaming || cancelled_) return false;
    if (data.empty()) return true;
    if (pending_bytes_ + data.size() <= max_pending_write_bytes_) {
      pending_bytes_ += data.size();
      return Post([data = std::move(data)](internal::Connection& c) mutable {
        c.WriteChunk(std::move(data));
      });
    }
  }
  // The client reads slower than the stream is produced: drop it.
  Post([](internal::Connection& c) { c.ClientGone(); });
  return false;
}

bool HttpExchange::KeepStreamAlive(int64_t every_ms, std::string data,
                                   std::function<bool()> alive) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kStreaming || cancelled_ || every_ms <= 0 || data.empty()) return false;
  }
  return Post([every_ms, data = std::move(data),
               alive = std::move(alive)](internal::Connection& c) mutable {
    c.KeepStreamAlive(every_ms, std::move(data), std::move(alive));
  });
}

void HttpExchange::EndStream() {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kStreaming) return;
    state_ = State::kDone;
  }
  Post([](internal::Connection& c) { c.WriteLastChunk(); });
}

}  // namespace connex::serving
