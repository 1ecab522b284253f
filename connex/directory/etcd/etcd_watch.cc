// EtcdClient's watches (the class is internal/etcd_client_impl.h): one thread per watch streams
// from one member at a time, probes a quiet member for progress, and resumes on the next member
// from the revision after the last it delivered; a compaction, or a cancel for a reason of etcd's,
// ends the watch (CompactRevisionOf reads the compaction's revision back from the Status).
#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "connex/base/logging.h"
#include "connex/base/logging_spdlog.h"
#include "connex/base/mutex.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/internal/etcd_client_impl.h"

namespace connex::directory::etcd {
namespace {

constexpr char kCompactPayloadUrl[] = "type.connex.dev/etcd.compact_revision";

}  // namespace

namespace client_internal {
namespace {

class WatchImpl final : public EtcdWatch {
 public:
  WatchImpl(EtcdClientImpl* client, std::string key, const WatchOptions& options)
      : client_(client), key_(std::move(key)), options_(options) {
    next_revision_ = options.start_revision;
    thread_ = std::thread([this] { Run(); });
  }
  ~WatchImpl() override {
    Cancel();
    thread_.join();
  }

  absl::StatusOr<WatchResponse> Next(absl::Duration timeout) override;
  void Cancel() override;
  std::string member() const override {
    MutexLock lock(&mu_);
    return member_;
  }
  int64_t next_revision() const override {
    MutexLock lock(&mu_);
    return next_revision_;
  }

 private:
  void Run();
  // Streams from one member until the stream ends; returns whether the member confirmed the
  // watch (so the next failure starts a new round without backoff). The end is logged as a
  // warning, or at debug level when `quiet` (the members after the first that failed in a row:
  // an election makes every member refuse for a second).
  bool StreamFrom(const Member& member, bool quiet);

  EtcdClientImpl* const client_;
  const std::string key_;
  const WatchOptions options_;
  std::thread thread_;

  mutable Mutex mu_;
  std::deque<WatchResponse> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status over_ ABSL_GUARDED_BY(mu_);  // not OK: the watch ended for this reason
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_revision_ ABSL_GUARDED_BY(mu_);
  std::string member_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

absl::StatusOr<WatchResponse> WatchImpl::Next(absl::Duration timeout) {
  MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || !over_.ok() || cancelled_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (!queue_.empty()) {
    WatchResponse response = std::move(queue_.front());
    queue_.pop_front();
    return response;
  }
  if (!over_.ok()) return over_;
  if (cancelled_) return absl::CancelledError(StrCat("etcd: watch of '", key_, "' was cancelled"));
  return absl::DeadlineExceededError(
      StrCat("etcd: watch of '", key_, "': nothing within ", absl::FormatDuration(timeout)));
}

void WatchImpl::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

void WatchImpl::Run() {
  const EtcdClientOptions& options = client_->options();
  absl::Duration backoff = options.initial_backoff;
  size_t index = client_->current_index();
  size_t failed_in_a_row = 0;
  while (true) {
    {
      MutexLock lock(&mu_);
      if (cancelled_ || !over_.ok()) return;
    }
    bool confirmed = StreamFrom(client_->member(index), /*quiet=*/failed_in_a_row > 0);
    {
      MutexLock lock(&mu_);
      if (cancelled_ || !over_.ok()) return;
    }
    if (confirmed) {
      failed_in_a_row = 0;
      backoff = options.initial_backoff;
    } else if (++failed_in_a_row % client_->member_count() == 0) {
      MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), backoff);
      backoff = std::min(backoff * 2, options.max_backoff);
    }
    ++index;
  }
}

bool WatchImpl::StreamFrom(const Member& member, bool quiet) {
  grpc::ClientContext context;
  client_->AddMetadata(&context, /*with_token=*/true);
  pb::WatchRequest request;
  {
    MutexLock lock(&mu_);
    if (cancelled_) return false;
    context_ = &context;
    member_ = member.name;
    pb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(options_.range_end);
    create->set_start_revision(next_revision_);
    create->set_prev_kv(options_.prev_kv);
    create->set_progress_notify(options_.progress_notify);
  }
  auto stream = member.watch->Watch(&context);
  bool confirmed = false;
  std::string ended;
  if (stream->Write(request)) {
    // The probe: after probe_interval without a response, ask the member for progress; no answer
    // within the attempt timeout means the member is stopped or cut off, and the stream is
    // cancelled (so that the watch moves on in about a second, not after gRPC's keepalive).
    // gRPC allows this one writer beside the reading thread.
    bool stream_done = false;
    absl::Time last_response = absl::Now();
    std::thread probe([&] {
      const EtcdClientOptions& options = client_->options();
      std::optional<absl::Time> probe_sent;
      MutexLock lock(&mu_);
      auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stream_done || cancelled_; };
      while (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(100))) {
        const absl::Time now = absl::Now();
        if (probe_sent.has_value() && last_response >= *probe_sent) probe_sent.reset();
        if (probe_sent.has_value()) {
          if (now - *probe_sent > options.attempt_timeout) {
            ended = StrCat("no answer to a progress request within ",
                           absl::FormatDuration(options.attempt_timeout));
            context.TryCancel();
            return;
          }
        } else if (now - last_response > options.watch_probe_interval) {
          pb::WatchRequest progress;
          progress.mutable_progress_request();
          probe_sent = now;
          mu_.Unlock();
          bool written = stream->Write(progress);
          mu_.Lock();
          if (!written) return;  // the stream is over; Read sees it too
        }
      }
    });
    pb::WatchResponse response;
    while (stream->Read(&response)) {
      MutexLock lock(&mu_);
      last_response = absl::Now();
      // The answer to a progress request (watch id -1) proves the member alive, nothing more:
      // etcd 3.4 gives it the store's revision even while this watcher's events are still on
      // their way, so it is not a progress notification.
      if (response.watch_id() == -1 && !response.created() && response.events_size() == 0) {
        continue;
      }
      if (response.compact_revision() != 0) {
        over_ = absl::OutOfRangeError(
            StrCat("etcd: watch of '", key_, "' on ", member.name, ": revision ", next_revision_,
                   " has been compacted (compacted up to ", response.compact_revision(),
                   "): take a snapshot and watch again from after its revision"));
        over_.SetPayload(kCompactPayloadUrl,
                         absl::Cord(std::to_string(response.compact_revision())));
        context.TryCancel();
        break;
      }
      if (response.canceled()) {
        // A watch that etcd cancels for a reason of its own (a permission, a bad range) stays
        // cancelled on every member; a member that lost its leader cancels with "no leader".
        const std::string& reason = response.cancel_reason();
        if (reason.find("no leader") != std::string::npos) {
          ended = reason;
          context.TryCancel();
          break;
        }
        absl::StatusCode code = reason.find("permission denied") != std::string::npos
                                    ? absl::StatusCode::kPermissionDenied
                                    : absl::StatusCode::kFailedPrecondition;
        over_ = absl::Status(code, StrCat("etcd: watch of '", key_, "' on ", member.name,
                                          ": cancelled by etcd: ", reason));
        context.TryCancel();
        break;
      }
      if (response.created()) {
        confirmed = true;
        if (next_revision_ == 0) next_revision_ = response.header().revision() + 1;
        if (response.events_size() == 0) continue;
      }
      WatchResponse out;
      out.revision = response.header().revision();
      for (const mvccpb::Event& event : response.events()) {
        // A resumed stream starts at next_revision_, so nothing earlier should come; drop it if
        // it does rather than deliver an event twice.
        if (event.kv().mod_revision() < next_revision_) continue;
        WatchEvent e;
        e.type = event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                       : WatchEvent::Type::kPut;
        e.kv = FromProto(event.kv());
        if (event.has_prev_kv()) e.prev_kv = FromProto(event.prev_kv());
        out.events.push_back(std::move(e));
      }
      if (!out.events.empty()) {
        next_revision_ = out.events.back().kv.mod_revision + 1;
      } else if (response.events_size() == 0) {
        out.progress_notify = true;
        next_revision_ = std::max(next_revision_, out.revision + 1);
      } else {
        continue;  // only duplicates
      }
      queue_.push_back(std::move(out));
    }
    {
      MutexLock lock(&mu_);
      stream_done = true;
    }
    probe.join();
  }
  grpc::Status status = stream->Finish();
  MutexLock lock(&mu_);
  context_ = nullptr;
  member_.clear();
  if (!cancelled_ && over_.ok()) {
    if (ended.empty()) ended = status.ok() ? "the member closed the stream" : Describe(status);
    Log().log(quiet ? spdlog::level::debug : spdlog::level::warn,
              "etcd: watch of '{}' on {} ended ({}); resuming from revision {} on the next member",
              key_, member.name, ended, next_revision_);
  }
  return confirmed;
}

}  // namespace

std::unique_ptr<EtcdWatch> EtcdClientImpl::Watch(std::string_view key,
                                                 const WatchOptions& options) {
  return std::make_unique<WatchImpl>(this, std::string(key), options);
}

}  // namespace client_internal

std::optional<int64_t> CompactRevisionOf(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kOutOfRange) return std::nullopt;
  auto payload = status.GetPayload(kCompactPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  return std::stoll(std::string(*payload));
}

}  // namespace connex::directory::etcd
