// The `ucx` transport, the owner's side (the class is internal/ucx_engine_impl.h): memory mapped
// with UCX (managed buffers allocated by UCX itself) and its packed rkeys; the side channel's
// server, which answers a reader's worker-address and rkey requests and its heartbeats; and the
// invalidation of a range on unregister, acknowledged by every reader before the unmap.
#include <string>
#include <utility>
#include <vector>

#include "connex/base/strings.h"
#include "connex/transport/ucx/internal/ucx_engine_impl.h"

namespace connex::transport::ucx {
namespace {

using internal::FrameHeader;
using internal::FrameType;

constexpr uint64_t kUcxAllocated = 1;  // Backing cookie: allocated (and mapped) by UCX

}  // namespace

absl::StatusOr<UcxEngine::Backing> UcxEngine::AllocateBacking(size_t length) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = length;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  void* rkey = nullptr;
  size_t rkey_len = 0;
  ucp_mem_attr_t attr{};
  {
    MutexLock lock(&worker_.mu);
    ucs_status_t st = ucp_mem_map(worker_.context(), &mp, &memh);
    if (st != UCS_OK) {
      return absl::ResourceExhaustedError(
          StrCat("ucx: cannot allocate ", length, " bytes: ", ucs_status_string(st)));
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    st = ucp_mem_query(memh, &attr);
    if (st == UCS_OK) st = ucp_rkey_pack(worker_.context(), memh, &rkey, &rkey_len);
    if (st != UCS_OK) {
      ucp_mem_unmap(worker_.context(), memh);
      return UcsError("allocate", st);
    }
  }
  MemoryKey key{memh, std::string(static_cast<char*>(rkey), rkey_len)};
  {
    MutexLock lock(&worker_.mu);
    ucp_rkey_buffer_release(rkey);
  }
  MutexLock lock(&keys_mu_);
  keys_[reinterpret_cast<uint64_t>(attr.address)] = std::move(key);
  return Backing{attr.address, kUcxAllocated};
}

void UcxEngine::FreeBacking(void* addr, size_t length, uint64_t cookie) {
  if (cookie != kUcxAllocated) EngineBase::FreeBacking(addr, length, cookie);
}

absl::Status UcxEngine::OnRegister(internal::RegionTable::Region& region) {
  if (region.managed && region.cookie == kUcxAllocated) return absl::OkStatus();  // mapped
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = reinterpret_cast<void*>(region.base);
  mp.length = region.length;
  ucp_mem_h memh = nullptr;
  void* rkey = nullptr;
  size_t rkey_len = 0;
  {
    MutexLock lock(&worker_.mu);
    ucs_status_t st = ucp_mem_map(worker_.context(), &mp, &memh);
    if (st != UCS_OK) {
      return absl::InvalidArgumentError(StrCat("ucx: cannot map ",
                                               internal::RangeString(region.base, region.length),
                                               ": ", ucs_status_string(st)));
    }
    st = ucp_rkey_pack(worker_.context(), memh, &rkey, &rkey_len);
    if (st != UCS_OK) {
      ucp_mem_unmap(worker_.context(), memh);
      return UcsError("rkey pack", st);
    }
  }
  MemoryKey key{memh, std::string(static_cast<char*>(rkey), rkey_len)};
  {
    MutexLock lock(&worker_.mu);
    ucp_rkey_buffer_release(rkey);
  }
  MutexLock lock(&keys_mu_);
  keys_[region.base] = std::move(key);
  return absl::OkStatus();
}

void UcxEngine::OnUnregister(const internal::RegionTable::Region& region) {
  // Tell every reader to drop its rkey for the range and wait for their acks, so that no get
  // touches the memory once we return (bounded by suspect_ms for a hung reader).
  std::vector<std::shared_ptr<ControlConn>> controls;
  {
    MutexLock lock(&server_mu_);
    for (auto& c : controls_) controls.push_back(c);
  }
  for (auto& c : controls) {
    MutexLock lock(&c->mu);
    if (c->closed) continue;
    ++c->invalidations_sent;
    if (!internal::SendFrame(c->fd, internal::MakeFrame(FrameType::kInvalidate, region.base))
             .ok()) {
      c->closed = true;
    }
  }
  for (auto& c : controls) {
    MutexLock lock(&c->mu);
    auto acked = [&c]() { return c->closed || c->invalidations_acked >= c->invalidations_sent; };
    c->mu.AwaitWithTimeout(absl::Condition(&acked), absl::Milliseconds(options_.suspect_ms));
  }
  MemoryKey key;
  {
    MutexLock lock(&keys_mu_);
    auto it = keys_.find(region.base);
    if (it == keys_.end()) return;
    key = std::move(it->second);
    keys_.erase(it);
  }
  MutexLock lock(&worker_.mu);
  ucp_mem_unmap(worker_.context(), key.memh);
}

void UcxEngine::Serve(int fd) {
  std::string client;
  absl::StatusOr<internal::ChannelKind> kind =
      internal::ServerHandshake(fd, options_.local_lid, options_.connect_timeout_ms, &client);
  std::shared_ptr<ControlConn> control;
  if (kind.ok() && *kind == internal::ChannelKind::kControl) {
    internal::TuneTcp(fd, 0);
    control = std::make_shared<ControlConn>();
    control->fd = fd;
    MutexLock lock(&server_mu_);
    controls_.push_back(control);
  }
  internal::AbortCheck abort = [this]() {
    return stopping_ ? absl::CancelledError("stopping") : absl::OkStatus();
  };
  while (kind.ok()) {
    FrameHeader h;
    if (!internal::RecvFrame(fd, &h, nullptr, 0, kSliceMs, abort).ok()) break;
    absl::Status s;
    switch (static_cast<FrameType>(h.type)) {
      case FrameType::kPing: {
        if (control == nullptr) {
          s = absl::InvalidArgumentError("PING on a data channel");
          break;
        }
        MutexLock lock(&control->mu);
        s = internal::SendFrame(fd, internal::MakeFrame(FrameType::kPong));
        break;
      }
      case FrameType::kInvalidateAck: {
        if (control == nullptr) {
          s = absl::InvalidArgumentError("ack on a data channel");
          break;
        }
        MutexLock lock(&control->mu);
        ++control->invalidations_acked;
        break;
      }
      case FrameType::kWorkerAddress:
        s = internal::SendFrame(
            fd, internal::MakeFrame(FrameType::kWorkerAddressInfo, internal::HostId()),
            worker_.address());
        break;
      case FrameType::kRkey: {
        absl::StatusOr<internal::RegionTable::Pin> pin = regions().Acquire(
            h.a, h.b, StrCat("ucx: read of ", options_.local_lid.ToString(), ": remote"));
        if (!pin.ok()) {
          s = internal::SendError(fd, pin.status());
          break;
        }
        std::string packed;
        {
          MutexLock lock(&keys_mu_);
          auto it = keys_.find(pin->region().base);
          if (it != keys_.end()) packed = it->second.packed;
        }
        if (packed.empty()) {
          s = internal::SendError(fd, absl::InvalidArgumentError("ucx: range not mapped"));
        } else {
          s = internal::SendFrame(
              fd,
              internal::MakeFrame(FrameType::kRkeyInfo, pin->region().base, pin->region().length),
              packed);
        }
        break;
      }
      default:
        s = absl::InvalidArgumentError("unexpected frame");
    }
    if (!s.ok()) break;
  }
  if (control != nullptr) {
    MutexLock lock(&server_mu_);
    controls_.remove(control);
    MutexLock cl(&control->mu);
    control->closed = true;
  }
}

}  // namespace connex::transport::ucx
