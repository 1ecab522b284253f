// Fault-injection tests of the mem transport: every fault the step protocol's tests rely on.
#include "connex/transport/mem/mem_engine.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "connex/base/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::transport::mem {
namespace {

using ::testing::HasSubstr;

Lid L(std::string_view text) { return Lid::Parse(text).value(); }

// Collects an engine's peer events; waits for them with a deadline.
class Recorder {
 public:
  explicit Recorder(TransferEngine& engine) : engine_(engine) {
    id_ = engine.SubscribePeerEvents([this](const PeerEvent& e) {
      MutexLock lock(&mu_);
      events_.push_back(e);
    });
  }
  ~Recorder() { engine_.UnsubscribePeerEvents(id_); }

  int Count(PeerEventKind kind, const Lid& lid) {
    MutexLock lock(&mu_);
    return CountLocked(kind, lid);
  }
  // True when at least `n` events of `kind` about `lid` arrived within `ms`.
  bool WaitFor(PeerEventKind kind, const Lid& lid, int n = 1, int ms = 5000) {
    MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CountLocked(kind, lid) >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Milliseconds(ms));
  }
  std::vector<PeerEvent> events() {
    MutexLock lock(&mu_);
    return events_;
  }

 private:
  int CountLocked(PeerEventKind kind, const Lid& lid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const PeerEvent& e : events_) n += (e.kind == kind && e.lid == lid);
    return n;
  }
  TransferEngine& engine_;
  uint64_t id_ = 0;
  Mutex mu_;
  std::vector<PeerEvent> events_ ABSL_GUARDED_BY(mu_);
};

class MemTest : public ::testing::Test {
 protected:
  std::unique_ptr<TransferEngine> Make(const Lid& lid) {
    TransportOptions o;
    o.backend = Backend::kMem;
    o.local_lid = lid;
    o.suspect_ms = 1000;
    o.fabric = fabric_;
    return CreateTransferEngine(o).value();
  }
  PeerRef Ref(const Lid& lid, TransferEngine& e) { return PeerRef{lid, e.LocalAddresses()}; }

  void SetUp() override {
    a_ = Make(la_);
    b_ = Make(lb_);
    src_ = static_cast<uint8_t*>(b_->AllocateManagedBuffer(kSize).value());
    dst_ = static_cast<uint8_t*>(a_->AllocateManagedBuffer(kSize).value());
    for (size_t i = 0; i < kSize; ++i) src_[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
  }
  absl::Status Read(size_t offset = 0, size_t length = 1024) {
    return a_->TransferSyncRead(Ref(lb_, *b_), dst_ + offset,
                                reinterpret_cast<uint64_t>(src_) + offset, length);
  }

  static constexpr size_t kSize = 1 << 16;
  FakeClock clock_;
  std::shared_ptr<Fabric> fabric_ =
      Fabric::Create(FabricOptions{.seed = 42, .partition_timeout_ms = 100, .clock = &clock_});
  Lid la_ = L("m/g0/s0/r0"), lb_ = L("m/g1/s0/r0");
  std::unique_ptr<TransferEngine> a_, b_;
  uint8_t* src_ = nullptr;
  uint8_t* dst_ = nullptr;
};

TEST_F(MemTest, ReadCopiesBytesAndAnnouncesConnection) {
  Recorder rec(*a_);
  ASSERT_TRUE(Read(3, 1001).ok());
  EXPECT_EQ(std::memcmp(dst_ + 3, src_ + 3, 1001), 0);
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kConnected, lb_));
  EXPECT_EQ(a_->GetCapabilities().backend, "mem");
  EXPECT_THAT(a_->LocalAddresses()[0], HasSubstr("mem://"));
}

TEST_F(MemTest, UnregisteredRangesAreInvalidArgumentNamingTheRange) {
  std::vector<uint8_t> plain(64);
  absl::Status s =
      a_->TransferSyncRead(Ref(lb_, *b_), plain.data(), reinterpret_cast<uint64_t>(src_), 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("local range"));
  s = a_->TransferSyncRead(Ref(lb_, *b_), dst_, reinterpret_cast<uint64_t>(src_) + kSize - 10,
                           20);  // runs past the end of the remote buffer
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("remote range"));
}

TEST_F(MemTest, KillFailsReadsAndDeliversDead) {
  Recorder rec(*a_);
  ASSERT_TRUE(a_->Connect(Ref(lb_, *b_)).ok());
  fabric_->Kill(lb_);
  EXPECT_FALSE(fabric_->IsAlive(lb_));
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kDead, lb_));
  EXPECT_EQ(Read().code(), absl::StatusCode::kUnavailable);
  // A killed endpoint cannot read either.
  EXPECT_EQ(b_->TransferSyncRead(Ref(la_, *a_), src_, reinterpret_cast<uint64_t>(dst_), 8).code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(MemTest, DestroyedEngineIsAPeerDeath) {
  Recorder rec(*a_);
  PeerRef ref = Ref(lb_, *b_);
  ASSERT_TRUE(a_->Connect(ref).ok());
  b_.reset();
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kDead, lb_));
  EXPECT_EQ(a_->TransferSyncRead(ref, dst_, 4096, 8).code(), absl::StatusCode::kUnavailable);
}

TEST_F(MemTest, RestartUnderSameLidReconnectsWithoutRestartingReader) {
  Recorder rec(*a_);
  PeerRef old_ref = Ref(lb_, *b_);
  ASSERT_TRUE(Read().ok());
  fabric_->Kill(lb_);
  ASSERT_TRUE(rec.WaitFor(PeerEventKind::kDead, lb_));
  b_ = Make(lb_);  // the restarted process
  PeerRef new_ref = Ref(lb_, *b_);
  EXPECT_NE(old_ref.addresses, new_ref.addresses);
  auto* src2 = static_cast<uint8_t*>(b_->AllocateManagedBuffer(64).value());
  std::memset(src2, 0xab, 64);
  EXPECT_EQ(a_->TransferSyncRead(old_ref, dst_, reinterpret_cast<uint64_t>(src2), 64).code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(a_->TransferSyncRead(new_ref, dst_, reinterpret_cast<uint64_t>(src2), 64).ok());
  EXPECT_EQ(dst_[63], 0xab);
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kConnected, lb_, 2));
}

TEST_F(MemTest, WrongLidAtAddressIsFailedPrecondition) {
  PeerRef ref{L("m/g7/s0/r0"), b_->LocalAddresses()};
  EXPECT_EQ(a_->TransferSyncRead(ref, dst_, reinterpret_cast<uint64_t>(src_), 8).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MemTest, PartitionTimesOutThenSuspectsThenHeals) {
  Recorder rec(*a_);
  ASSERT_TRUE(a_->Connect(Ref(lb_, *b_)).ok());
  fabric_->Partition(la_, lb_);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Read().code(), absl::StatusCode::kUnavailable);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_EQ(rec.Count(PeerEventKind::kSuspected, lb_), 0);
  clock_.AdvanceMs(1000);  // the watcher's suspect_ms
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kSuspected, lb_));
  fabric_->Heal(la_, lb_);
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kConnected, lb_, 2));
  EXPECT_TRUE(Read().ok());
}

TEST_F(MemTest, ReadWaitingAcrossPartitionSucceedsWhenHealedInTime) {
  auto fabric = Fabric::Create(FabricOptions{.partition_timeout_ms = 5000});
  fabric_ = fabric;
  a_ = Make(la_);
  b_ = Make(lb_);
  auto* src = static_cast<uint8_t*>(b_->AllocateManagedBuffer(64).value());
  auto* dst = static_cast<uint8_t*>(a_->AllocateManagedBuffer(64).value());
  fabric->Partition(la_, lb_);
  std::thread healer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fabric->Heal(la_, lb_);
  });
  EXPECT_TRUE(a_->TransferSyncRead(Ref(lb_, *b_), dst, reinterpret_cast<uint64_t>(src), 64).ok());
  healer.join();
}

TEST_F(MemTest, DelayedReadTakesAtLeastTheDelayAndKillDuringItFails) {
  fabric_->SetReadDelay(lb_, 50);
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(Read().ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  fabric_->SetReadDelay(lb_, 300);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fabric_->Kill(lb_);
  });
  EXPECT_EQ(Read().code(), absl::StatusCode::kUnavailable);
  killer.join();
}

TEST_F(MemTest, DropRateIsSeededAndDeterministic) {
  auto pattern = [this](uint64_t seed) {
    auto fabric = Fabric::Create(FabricOptions{.seed = seed});
    fabric_ = fabric;
    auto a = Make(la_);
    auto b = Make(lb_);
    auto* src = static_cast<uint8_t*>(b->AllocateManagedBuffer(64).value());
    auto* dst = static_cast<uint8_t*>(a->AllocateManagedBuffer(64).value());
    fabric->SetDropRate(0.3);
    std::vector<bool> ok;
    for (int i = 0; i < 1000; ++i) {
      absl::Status s = a->TransferSyncRead(Ref(lb_, *b), dst, reinterpret_cast<uint64_t>(src), 64);
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
      }
      ok.push_back(s.ok());
    }
    EXPECT_EQ(fabric->reads_started(), 1000u);
    return ok;
  };
  std::vector<bool> p1 = pattern(7), p2 = pattern(7), p3 = pattern(8);
  EXPECT_EQ(p1, p2);
  EXPECT_NE(p1, p3);
  int dropped = static_cast<int>(std::count(p1.begin(), p1.end(), false));
  EXPECT_GT(dropped, 240);
  EXPECT_LT(dropped, 360);
}

TEST_F(MemTest, DropRateForOneOwnerOnly) {
  auto c = Make(L("m/g2/s0/r0"));
  auto* csrc = static_cast<uint8_t*>(c->AllocateManagedBuffer(64).value());
  fabric_->SetDropRate(1.0, lb_);
  EXPECT_EQ(Read().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(
      a_->TransferSyncRead(Ref(L("m/g2/s0/r0"), *c), dst_, reinterpret_cast<uint64_t>(csrc), 64)
          .ok());
  EXPECT_EQ(fabric_->reads_dropped(), 1u);
}

TEST_F(MemTest, FailNextReadsWithChosenCode) {
  fabric_->FailNextReads(lb_, 2, absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Read().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Read().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Read().ok());
}

TEST_F(MemTest, DuplicateEventsAreDeliveredTwice) {
  Recorder rec(*a_);
  fabric_->SetDuplicateEvents(true);
  ASSERT_TRUE(a_->Connect(Ref(lb_, *b_)).ok());
  fabric_->Kill(lb_);
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kConnected, lb_, 2));
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kDead, lb_, 2));
}

TEST_F(MemTest, InjectedSpuriousDeathDoesNotBreakReads) {
  Recorder rec(*a_);
  fabric_->InjectEvent(la_, PeerEvent{PeerEventKind::kDead, lb_, "", "spurious"});
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kDead, lb_));
  EXPECT_TRUE(Read().ok());
}

TEST_F(MemTest, UnregisterWaitsForOutstandingRead) {
  uint8_t* local = new uint8_t[4096];
  ASSERT_TRUE(a_->RegisterMemory(local, 4096).ok());
  fabric_->SetReadDelay(lb_, 100);
  std::atomic<bool> read_done{false};
  absl::Status read_status;
  std::thread reader([&] {
    read_status =
        a_->TransferSyncRead(Ref(lb_, *b_), local, reinterpret_cast<uint64_t>(src_), 4096);
    read_done = true;
  });
  // Wait until the read has started (it is counted before the delay).
  while (fabric_->reads_started() == 0) std::this_thread::yield();
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(a_->UnregisterMemory(local).ok());
  // Unregister returned only after the read had written everything.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  EXPECT_EQ(std::memcmp(local, src_, 4096), 0);
  reader.join();
  EXPECT_TRUE(read_done.load());
  EXPECT_TRUE(read_status.ok());
  EXPECT_EQ(std::memcmp(local, src_, 4096), 0);
  fabric_->SetReadDelay(lb_, 0);
  EXPECT_EQ(a_->TransferSyncRead(Ref(lb_, *b_), local, reinterpret_cast<uint64_t>(src_), 8).code(),
            absl::StatusCode::kInvalidArgument);
  delete[] local;
}

TEST_F(MemTest, ManagedBuffers) {
  std::vector<uint8_t> plain(100, 9);
  ASSERT_TRUE(a_->CopyToManagedBuffer(dst_ + 10, plain.data(), 100).ok());
  std::vector<uint8_t> back(100);
  ASSERT_TRUE(a_->CopyFromManagedBuffer(back.data(), dst_ + 10, 100).ok());
  EXPECT_EQ(back, plain);
  EXPECT_EQ(a_->CopyToManagedBuffer(dst_ + kSize - 10, plain.data(), 100).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->RegisterMemory(plain.data(), plain.size()).ok());
  EXPECT_EQ(a_->CopyToManagedBuffer(plain.data(), back.data(), 10).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->FreeManagedBuffer(plain.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->UnregisterMemory(dst_).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->UnregisterMemory(plain.data()).ok());
  EXPECT_EQ(a_->RegisterMemory(dst_ + 8, 8).code(), absl::StatusCode::kInvalidArgument);  // overlap
  ASSERT_TRUE(a_->FreeManagedBuffer(dst_).ok());
  dst_ = nullptr;
}

TEST_F(MemTest, UnsubscribedCallbackIsNeverCalledAgain) {
  std::atomic<int> calls{0};
  uint64_t id = a_->SubscribePeerEvents([&](const PeerEvent&) { ++calls; });
  ASSERT_TRUE(a_->Connect(Ref(lb_, *b_)).ok());
  Recorder rec(*a_);  // subscribed after: sees later events only
  a_->UnsubscribePeerEvents(id);
  int before = calls.load();
  fabric_->Kill(lb_);
  ASSERT_TRUE(rec.WaitFor(PeerEventKind::kDead, lb_));
  EXPECT_EQ(calls.load(), before);
}

TEST(BackendTest, ParseBackend) {
  EXPECT_EQ(ParseBackend("tcp").value(), Backend::kTcp);
  EXPECT_EQ(ParseBackend("auto").value(), Backend::kAuto);
  absl::StatusOr<Backend> bad = ParseBackend("rdma");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'rdma'"));
  TransportOptions o;
  o.backend = Backend::kMem;
  EXPECT_EQ(CreateTransferEngine(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendTest, OptionsFromEnv) {
  setenv("CONNEX_PP_BACKEND", "shm", 1);
  setenv("CONNEX_TRANSPORT_HEARTBEAT_MS", "100", 1);
  auto o = TransportOptions::FromEnv(L("m/g0/s0/r0"));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->backend, Backend::kShm);
  EXPECT_EQ(o->heartbeat_ms, 100);
  EXPECT_EQ(o->suspect_ms, 1000);
  setenv("CONNEX_TRANSPORT_SUSPECT_MS", "soon", 1);
  EXPECT_EQ(TransportOptions::FromEnv(L("m/g0/s0/r0")).status().code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("CONNEX_PP_BACKEND");
  unsetenv("CONNEX_TRANSPORT_HEARTBEAT_MS");
  unsetenv("CONNEX_TRANSPORT_SUSPECT_MS");
}

TEST(BackendTest, TcpSocketBufferAndUcxPeerErrorsFromEnv) {
  auto o = TransportOptions::FromEnv(L("m/g0/s0/r0"));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->tcp_socket_buffer, 256 << 10);
  EXPECT_EQ(o->ucx_peer_errors, UcxPeerErrors::kAuto);
  setenv("CONNEX_TRANSPORT_TCP_SOCKET_BUFFER", "0", 1);
  setenv("CONNEX_TRANSPORT_UCX_PEER_ERRORS", "Off", 1);
  o = TransportOptions::FromEnv(L("m/g0/s0/r0"));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->tcp_socket_buffer, 0);
  EXPECT_EQ(o->ucx_peer_errors, UcxPeerErrors::kOff);
  setenv("CONNEX_TRANSPORT_UCX_PEER_ERRORS", "1", 1);
  EXPECT_EQ(TransportOptions::FromEnv(L("m/g0/s0/r0"))->ucx_peer_errors, UcxPeerErrors::kOn);
  setenv("CONNEX_TRANSPORT_UCX_PEER_ERRORS", "sometimes", 1);
  absl::Status bad = TransportOptions::FromEnv(L("m/g0/s0/r0")).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("CONNEX_TRANSPORT_UCX_PEER_ERRORS"));
  EXPECT_THAT(bad.message(), HasSubstr("'sometimes'"));
  setenv("CONNEX_TRANSPORT_UCX_PEER_ERRORS", "auto", 1);
  setenv("CONNEX_TRANSPORT_TCP_SOCKET_BUFFER", "-1", 1);
  EXPECT_EQ(TransportOptions::FromEnv(L("m/g0/s0/r0")).status().code(),
            absl::StatusCode::kInvalidArgument);
  unsetenv("CONNEX_TRANSPORT_TCP_SOCKET_BUFFER");
  unsetenv("CONNEX_TRANSPORT_UCX_PEER_ERRORS");
}

}  // namespace
}  // namespace connex::transport::mem
