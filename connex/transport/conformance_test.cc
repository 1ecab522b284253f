// The transport conformance suite: one TEST_P instantiated for every backend. Peers are real
// processes (connex_transport_peer) killed with SIGKILL, except for `mem`, whose peers are
// engines on the same in-process fabric, "killed" by the fabric.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "connex/base/mutex.h"
#include "connex/base/wait.h"
#include "connex/transport/mem/mem_engine.h"
#include "connex/transport/shm/shm_engine.h"
#include "connex/transport/testing/peer_server.h"
#include "connex/transport/transfer_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::transport {
namespace {

using ::testing::HasSubstr;
using testing::PatternByte;

constexpr size_t kPeerSize = (64 << 20) + 4096;

Lid L(std::string_view text) { return Lid::Parse(text).value(); }

std::string PeerBinary() {
  const char* dir = std::getenv("CONNEX_BIN_DIR");
  if (dir != nullptr) return std::string(dir) + "/connex_transport_peer";
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "connex_transport_peer")
      .string();
}

// Collects an engine's peer events.
class Recorder {
 public:
  explicit Recorder(TransferEngine& engine) : engine_(engine) {
    id_ = engine.SubscribePeerEvents([this](const PeerEvent& e) {
      MutexLock lock(&mu_);
      events_.push_back(e);
    });
  }
  ~Recorder() { engine_.UnsubscribePeerEvents(id_); }
  bool WaitFor(PeerEventKind kind, const Lid& lid, int n = 1, int ms = 10000) {
    MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      int c = 0;
      for (const PeerEvent& e : events_) c += (e.kind == kind && e.lid == lid);
      return c >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Milliseconds(ms));
  }

 private:
  TransferEngine& engine_;
  uint64_t id_ = 0;
  Mutex mu_;
  std::vector<PeerEvent> events_ ABSL_GUARDED_BY(mu_);
};

// A peer whose buffer holds PatternByte(seed, i).
class Peer {
 public:
  virtual ~Peer() = default;
  virtual void Kill() = 0;                     // SIGKILL
  virtual bool Stop() { return false; }        // SIGSTOP; false when not supported
  virtual void Continue() {}                   // SIGCONT
  virtual void Command(const std::string&) {}  // a line on the peer's stdin
  virtual std::string ReadLine() { return ""; }
  PeerRef ref;
  uint64_t base = 0;
  uint64_t seed = 0;
};

class ProcessPeer : public Peer {
 public:
  ~ProcessPeer() override {
    if (pid_ > 0) {
      kill(pid_, SIGCONT);
      close(to_child_);  // EOF: the peer shuts down cleanly
      int status = 0;
      pid_t done = 0;
      for (int i = 0; i < 1000 && (done = waitpid(pid_, &status, WNOHANG)) == 0; ++i) {
        usleep(10000);
      }
      if (done == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        ADD_FAILURE() << "peer did not exit within 10 s of its stdin closing";
      } else {
        // A clean exit, and under ASan no leak (LeakSanitizer would make the status non-zero).
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer exit status " << status;
      }
    }
    if (from_child_ != nullptr) fclose(from_child_);
  }
  static std::unique_ptr<ProcessPeer> Start(Backend backend, const Lid& lid, uint64_t seed) {
    auto p = std::make_unique<ProcessPeer>();
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return nullptr;
    std::string bin = PeerBinary();
    std::string backend_name(BackendName(backend)), lid_text = lid.ToString(),
                                                    size = std::to_string(kPeerSize),
                                                    seed_text = std::to_string(seed);
    pid_t pid = fork();
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      execl(bin.c_str(), bin.c_str(), backend_name.c_str(), lid_text.c_str(), size.c_str(),
            seed_text.c_str(), nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->pid_ = pid;
    p->to_child_ = in[1];
    p->from_child_ = fdopen(out[0], "r");
    p->seed = seed;
    std::string line = p->ReadLine();
    std::istringstream is(line);
    std::string word, base_hex;
    size_t size_read = 0;
    is >> word >> base_hex >> size_read;
    if (word != "READY") {
      ADD_FAILURE() << "peer did not start: '" << line << "'";
      return nullptr;
    }
    p->base = std::stoull(base_hex, nullptr, 16);
    p->ref.lid = lid;
    std::string a;
    while (is >> a) p->ref.addresses.push_back(a);
    return p;
  }
  std::string ReadLine() override {
    pollfd pfd{fileno(from_child_), POLLIN, 0};
    if (poll(&pfd, 1, 20000) <= 0) return "(timeout)";
    char buf[4096];
    if (fgets(buf, sizeof(buf), from_child_) == nullptr) return "(eof)";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void Kill() override {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool Stop() override { return kill(pid_, SIGSTOP) == 0; }
  void Continue() override { kill(pid_, SIGCONT); }
  void Command(const std::string& c) override {
    std::string line = c + "\n";
    ASSERT_EQ(write(to_child_, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  FILE* from_child_ = nullptr;
};

class MemPeer : public Peer {
 public:
  MemPeer(std::shared_ptr<mem::Fabric> fabric, const Lid& lid, uint64_t seed) : fabric_(fabric) {
    TransportOptions o;
    o.backend = Backend::kMem;
    o.local_lid = lid;
    o.fabric = fabric;
    engine_ = CreateTransferEngine(o).value();
    buffer_ = engine_->AllocateManagedBuffer(kPeerSize).value();
    auto* b = static_cast<uint8_t*>(buffer_);
    for (size_t i = 0; i < kPeerSize; ++i) b[i] = PatternByte(seed, i);
    ref = PeerRef{lid, engine_->LocalAddresses()};
    base = reinterpret_cast<uint64_t>(buffer_);
    this->seed = seed;
  }
  void Kill() override { fabric_->Kill(ref.lid); }
  void Command(const std::string& c) override {
    if (c == "free") {
      ASSERT_TRUE(engine_->FreeManagedBuffer(buffer_).ok());
    }
  }
  std::string ReadLine() override { return "FREED"; }

 private:
  std::shared_ptr<mem::Fabric> fabric_;
  TransferEnginePtr engine_;
  void* buffer_ = nullptr;
};

class ConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kUcx && !CONNEX_HAVE_UCX) {
      GTEST_SKIP() << "this build has no UCX backend (-DCONNEX_UCX=OFF)";
    }
    // From the environment, as the peer processes do (e.g. UCX_TLS=tcp with
    // CONNEX_TRANSPORT_UCX_PEER_ERRORS=on|off, as CMake's extra ucx runs set them).
    TransportOptions o = TransportOptions::FromEnv(self_).value();
    o.backend = GetParam();
    o.heartbeat_ms = 50;
    o.suspect_ms = 400;
    o.fabric = fabric_;
    absl::StatusOr<TransferEnginePtr> engine = CreateTransferEngine(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    local_ = static_cast<uint8_t*>(engine_->AllocateManagedBuffer(kPeerSize).value());
    peer_ = StartPeer(1);
    ASSERT_NE(peer_, nullptr);
  }
  void TearDown() override {
    peer_.reset();
    engine_.reset();
  }
  std::unique_ptr<Peer> StartPeer(uint64_t seed) {
    if (GetParam() == Backend::kMem) return std::make_unique<MemPeer>(fabric_, peer_lid_, seed);
    return ProcessPeer::Start(GetParam(), peer_lid_, seed);
  }
  bool IsMem() const { return GetParam() == Backend::kMem; }
  absl::Status Read(const Peer& p, size_t local_off, size_t remote_off, size_t length) {
    return engine_->TransferSyncRead(p.ref, local_ + local_off, p.base + remote_off, length);
  }
  // Checks local_[local_off..] against the peer's pattern at remote_off.
  ::testing::AssertionResult Matches(const Peer& p, size_t local_off, size_t remote_off,
                                     size_t length) {
    for (size_t i = 0; i < length; ++i) {
      if (local_[local_off + i] != PatternByte(p.seed, remote_off + i)) {
        return ::testing::AssertionFailure()
               << "byte " << i << " of a " << length << "-byte read differs";
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::shared_ptr<mem::Fabric> fabric_ = mem::Fabric::Create();
  Lid self_ = L("conf/g0/s0/r0");
  Lid peer_lid_ = L("conf/g1/s0/r0");
  TransferEnginePtr engine_;
  uint8_t* local_ = nullptr;
  std::unique_ptr<Peer> peer_;
};

TEST_P(ConformanceTest, SizesFromOneByteTo64MiBAtOddOffsets) {
  const size_t sizes[] = {1, 3, 4095, 4099, 65537, (1 << 20) + 5, (16 << 20) + 1, (64 << 20) - 3};
  for (size_t size : sizes) {
    std::memset(local_, 0, std::min<size_t>(size + 16, kPeerSize));
    size_t loff = 5, roff = 11;
    absl::Status s = Read(*peer_, loff, roff, size);
    ASSERT_TRUE(s.ok()) << size << ": " << s;
    EXPECT_TRUE(Matches(*peer_, loff, roff, size)) << size;
    EXPECT_EQ(local_[loff - 1], 0) << "wrote before the destination";
    EXPECT_EQ(local_[loff + size], 0) << "wrote past the destination";
  }
}

TEST_P(ConformanceTest, ConcurrentReadsFromSeveralThreads) {
  constexpr int kThreads = 4, kReads = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      size_t slice = kPeerSize / kThreads;
      for (int i = 0; i < kReads; ++i) {
        size_t len = 1 + rng() % (i % 4 == 0 ? (2 << 20) : 8192);
        size_t roff = rng() % (kPeerSize - len);
        size_t loff = t * slice + rng() % (slice - len);
        absl::Status s = Read(*peer_, loff, roff, len);
        if (!s.ok() || !Matches(*peer_, loff, roff, len)) {
          ADD_FAILURE() << "thread " << t << " read " << i << ": " << s;
          ++failures;
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(ConformanceTest, UnregisteredAndOutOfRangeReadsAreInvalidArgument) {
  absl::Status s = Read(*peer_, 0, kPeerSize - 8, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("not registered"));
  s = engine_->TransferSyncRead(peer_->ref, local_, peer_->base - 4096, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::vector<uint8_t> plain(64);
  s = engine_->TransferSyncRead(peer_->ref, plain.data(), peer_->base, 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("local range"));
  s = Read(*peer_, kPeerSize - 8, 0, 16);  // local overrun
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The connection is still good.
  ASSERT_TRUE(Read(*peer_, 0, 0, 4096).ok());
  EXPECT_TRUE(Matches(*peer_, 0, 0, 4096));
}

TEST_P(ConformanceTest, WrongLidAtAddressIsFailedPrecondition) {
  PeerRef wrong{L("conf/g9/s0/r0"), peer_->ref.addresses};
  absl::Status s = engine_->TransferSyncRead(wrong, local_, peer_->base, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST_P(ConformanceTest, UnregisterLocalWhileReadOutstanding) {
  std::vector<uint8_t> mine(kPeerSize - 4096);
  ASSERT_TRUE(engine_->RegisterMemory(mine.data(), mine.size()).ok());
  std::atomic<bool> started{false};
  absl::Status read_status;
  std::thread reader([&] {
    started = true;
    read_status = engine_->TransferSyncRead(peer_->ref, mine.data(), peer_->base, mine.size());
  });
  while (!started) std::this_thread::yield();
  ASSERT_TRUE(engine_->UnregisterMemory(mine.data()).ok());
  reader.join();
  // Either the read finished before Unregister (and Unregister waited for it), or it started
  // after and found the range unregistered.
  if (read_status.ok()) {
    for (size_t i = 0; i < mine.size(); i += 4093) ASSERT_EQ(mine[i], PatternByte(1, i));
  } else {
    EXPECT_EQ(read_status.code(), absl::StatusCode::kInvalidArgument) << read_status;
  }
  EXPECT_EQ(engine_->TransferSyncRead(peer_->ref, mine.data(), peer_->base, 8).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(ConformanceTest, PeerFreesBufferWhileReadsOutstanding) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, invalid{0}, other{0};
  std::thread reader([&] {
    while (!stop) {
      absl::Status s = Read(*peer_, 0, 0, 8 << 20);
      if (s.ok()) {
        // A read that succeeded returned the peer's bytes, not freed memory.
        if (!Matches(*peer_, 0, 0, 4096) ||
            !Matches(*peer_, (8 << 20) - 4096, (8 << 20) - 4096, 4096)) {
          ++other;
        }
        ++ok;
      } else if (s.code() == absl::StatusCode::kInvalidArgument) {
        ++invalid;
      } else {
        ADD_FAILURE() << s;
        ++other;
      }
    }
  });
  while (ok.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  peer_->Command("free");
  EXPECT_EQ(peer_->ReadLine(), "FREED");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (invalid.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  reader.join();
  EXPECT_GT(invalid.load(), 0);
  EXPECT_EQ(other.load(), 0);
}

TEST_P(ConformanceTest, PeerKilledMidReadFailsPromptlyAndIsReported) {
  Recorder rec(*engine_);
  ASSERT_TRUE(engine_->Connect(peer_->ref).ok());
  ASSERT_TRUE(rec.WaitFor(PeerEventKind::kConnected, peer_lid_));
  std::atomic<bool> failed{false};
  std::atomic<int> reads{0};
  absl::Status last;
  std::thread reader([&] {
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < give_up) {
      absl::Status s = Read(*peer_, 0, 0, 64 << 20);
      if (!s.ok()) {
        last = s;
        failed = true;
        return;
      }
      ++reads;
    }
  });
  // Once a 64 MiB read has completed the reader is back-to-back in the next one: the kill lands
  // mid-read, with the connections up and data flowing.
  ASSERT_TRUE(WaitUntil([&] { return reads.load() >= 1 || failed.load(); }, 20000));
  ASSERT_FALSE(failed.load()) << "a read failed before the kill: " << last;
  auto killed_at = std::chrono::steady_clock::now();
  peer_->Kill();
  reader.join();
  ASSERT_TRUE(failed.load());
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
  const auto read_failed_after = std::chrono::steady_clock::now() - killed_at;
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kDead, peer_lid_));
  // Later reads of the dead peer fail too (Unavailable, not a hang).
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Read(*peer_, 0, 0, 8).code(), absl::StatusCode::kUnavailable);
  auto ms = [](auto d) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };
  std::printf("%s: the read in flight failed %lld ms after the kill; a later read in %lld ms\n",
              std::string(BackendName(GetParam())).c_str(), ms(read_failed_after),
              ms(std::chrono::steady_clock::now() - t0));
}

TEST_P(ConformanceTest, SameLidRestartedIsReconnectedWithoutRestartingReader) {
  Recorder rec(*engine_);
  ASSERT_TRUE(Read(*peer_, 0, 0, 4096).ok());
  peer_->Kill();
  ASSERT_TRUE(rec.WaitFor(PeerEventKind::kDead, peer_lid_));
  std::unique_ptr<Peer> restarted = StartPeer(2);
  ASSERT_NE(restarted, nullptr);
  absl::Status s = Read(*restarted, 3, 7, 100000);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(Matches(*restarted, 3, 7, 100000));  // the new process's bytes (seed 2)
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kConnected, peer_lid_, 2));
  peer_ = std::move(restarted);
}

TEST_P(ConformanceTest, CleanExitIsAPeerDeath) {
  if (IsMem()) GTEST_SKIP() << "mem peers do not exit; see mem_engine_test";
  Recorder rec(*engine_);
  ASSERT_TRUE(engine_->Connect(peer_->ref).ok());
  peer_.reset();  // closes its stdin: it exits normally
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kDead, peer_lid_));
}

TEST_P(ConformanceTest, StoppedPeerIsSuspectedAndRecovers) {
  if (!engine_->GetCapabilities().hung_peer_detection || IsMem()) {
    GTEST_SKIP() << "mem suspicion is tested with partitions in mem_engine_test";
  }
  Recorder rec(*engine_);
  ASSERT_TRUE(engine_->Connect(peer_->ref).ok());
  ASSERT_TRUE(peer_->Stop());
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kSuspected, peer_lid_, 1, 5000));
  peer_->Continue();
  EXPECT_TRUE(rec.WaitFor(PeerEventKind::kConnected, peer_lid_, 2, 5000));
  EXPECT_TRUE(Read(*peer_, 0, 0, 4096).ok());
}

TEST_P(ConformanceTest, Capabilities) {
  Capabilities c = engine_->GetCapabilities();
  EXPECT_EQ(c.backend, BackendName(GetParam()));
  EXPECT_TRUE(c.peer_events);
  EXPECT_FALSE(engine_->LocalAddresses().empty());
}

// The TCP listeners of this process that are not on loopback ("ADDRESS:PORT" as /proc shows
// them, hex): a socket of ours (an inode among /proc/self/fd) in state LISTEN.
std::vector<std::string> NonLoopbackListeners() {
  std::set<std::string> inodes;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state != "0A" || inodes.count(inode) == 0) continue;
      const std::string host = local.substr(0, local.find(':'));
      const bool loopback = host.size() == 8 ? host.substr(6) == "7F"  // 127.x.x.x, little endian
                                             : host == "00000000000000000000000001000000" ||
                                                   host == "0000000000000000FFFF00000100007F";
      if (!loopback) out.push_back(std::string(table) + " " + local);
    }
  }
  return out;
}

// Issue 23: `auto` and `ucx` listened on every interface (UCX's own tcp transport) for an endpoint
// on loopback, without --insecure. Every backend's listeners stay on loopback.
TEST_P(ConformanceTest, AnEndpointOnLoopbackListensOnLoopbackOnly) {
  ASSERT_FALSE(engine_->LocalAddresses().empty());
  EXPECT_THAT(NonLoopbackListeners(), ::testing::IsEmpty());
}

// shm: a clean exit removes the peer's socket; a SIGKILLed peer's socket is reaped by the next
// engine on the host. Segments are memfds: the kernel frees them with the last mapping.
TEST(ShmCleanupTest, SocketsRemovedOnExitAndReapedAfterKill) {
  auto socket_of = [](const Peer& p) {
    std::string a = p.ref.addresses.at(0);  // shm://host/path
    return a.substr(a.find('/', 6));
  };
  // A private directory, so that other tests' engines do not reap our stale socket first.
  std::string dir =
      std::filesystem::temp_directory_path() / ("connex-shm-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  setenv("CONNEX_TRANSPORT_SHM_DIR", dir.c_str(), 1);
  {
    auto peer = ProcessPeer::Start(Backend::kShm, L("clean/g0/s0/r0"), 1);
    ASSERT_NE(peer, nullptr);
    std::string path = socket_of(*peer);
    EXPECT_TRUE(std::filesystem::exists(path));
    peer.reset();  // stdin EOF: normal exit
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  auto peer = ProcessPeer::Start(Backend::kShm, L("clean/g0/s0/r0"), 1);
  ASSERT_NE(peer, nullptr);
  std::string path = socket_of(*peer);
  peer->Kill();
  EXPECT_TRUE(std::filesystem::exists(path));  // nobody could clean up
  EXPECT_EQ(path.rfind(dir, 0), 0u);
  EXPECT_EQ(shm::ReapStaleSockets(dir), 1);
  EXPECT_FALSE(std::filesystem::exists(path));
  unsetenv("CONNEX_TRANSPORT_SHM_DIR");
  std::filesystem::remove_all(dir);
}

// auto skips an shm address of another host and a dead ucx address, and reads over tcp.
TEST(AutoTest, PicksPerPeerFromPublishedAddresses) {
  TransportOptions o = TransportOptions::FromEnv(L("auto/g0/s0/r0")).value();
  o.backend = Backend::kTcp;
  o.local_lid = L("auto/g1/s0/r0");
  TransferEnginePtr owner = CreateTransferEngine(o).value();
  auto* src = static_cast<uint8_t*>(owner->AllocateManagedBuffer(4096).value());
  std::memset(src, 0x5a, 4096);
  o.backend = Backend::kAuto;
  o.local_lid = L("auto/g0/s0/r0");
  TransferEnginePtr reader = CreateTransferEngine(o).value();
  EXPECT_EQ(reader->GetCapabilities().backend, "auto");
  auto* dst = static_cast<uint8_t*>(reader->AllocateManagedBuffer(4096).value());
  PeerRef ref{
      L("auto/g1/s0/r0"),
      {"shm://no-such-host/dev/shm/x.sock", "ucx://127.0.0.1:1", owner->LocalAddresses().at(0)}};
  ASSERT_TRUE(reader->TransferSyncRead(ref, dst, reinterpret_cast<uint64_t>(src), 4096).ok());
  EXPECT_EQ(dst[4095], 0x5a);
  PeerRef none{L("auto/g1/s0/r0"), {"rdma://somewhere"}};
  EXPECT_EQ(reader->TransferSyncRead(none, dst, reinterpret_cast<uint64_t>(src), 8).code(),
            absl::StatusCode::kUnavailable);
}

// CONNEX_TRANSPORT_AUTO_BACKENDS: which backends auto starts, in order; bad lists are named.
TEST(AutoTest, StartsTheBackendsItIsGiven) {
  EXPECT_EQ(ParseAutoBackends("shm,tcp").value(),
            (std::vector<Backend>{Backend::kShm, Backend::kTcp}));
  EXPECT_EQ(ParseAutoBackends(" tcp ").value(), std::vector<Backend>{Backend::kTcp});
  for (const char* bad : {"", "shm,,tcp", "mem", "auto", "tcp,tcp", "rdma"}) {
    absl::StatusOr<std::vector<Backend>> got = ParseAutoBackends(bad);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ParseAutoBackends("shm,tcp,shm").status().message()),
              ::testing::HasSubstr("shm is named twice"));
  setenv("CONNEX_TRANSPORT_AUTO_BACKENDS", "tcp,udp", 1);
  absl::StatusOr<TransportOptions> env = TransportOptions::FromEnv(L("auto/g0/s0/r0"));
  unsetenv("CONNEX_TRANSPORT_AUTO_BACKENDS");
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(
      std::string(env.status().message()),
      ::testing::HasSubstr("CONNEX_TRANSPORT_AUTO_BACKENDS: auto backends 'tcp,udp': 'udp'"));
  // tcp alone: an shm address the peer publishes first is not tried (no shm engine started).
  TransportOptions o = TransportOptions::FromEnv(L("auto/g0/s0/r0")).value();
  o.backend = Backend::kTcp;
  o.local_lid = L("auto/g1/s0/r1");
  TransferEnginePtr owner = CreateTransferEngine(o).value();
  o.backend = Backend::kAuto;
  o.local_lid = L("auto/g0/s0/r1");
  o.auto_backends = {Backend::kTcp};
  TransferEnginePtr reader = CreateTransferEngine(o).value();
  for (const std::string& a : reader->LocalAddresses()) EXPECT_EQ(a.rfind("tcp://", 0), 0u) << a;
  auto* src = static_cast<uint8_t*>(owner->AllocateManagedBuffer(64).value());
  std::memset(src, 0x33, 64);
  auto* dst = static_cast<uint8_t*>(reader->AllocateManagedBuffer(64).value());
  PeerRef ref{L("auto/g1/s0/r1"), owner->LocalAddresses()};
  ASSERT_TRUE(reader->TransferSyncRead(ref, dst, reinterpret_cast<uint64_t>(src), 64).ok());
  EXPECT_EQ(dst[63], 0x33);
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest,
                         ::testing::Values(Backend::kMem, Backend::kTcp, Backend::kShm,
                                           Backend::kUcx, Backend::kAuto),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return std::string(BackendName(info.param));
                         });

}  // namespace
}  // namespace connex::transport
