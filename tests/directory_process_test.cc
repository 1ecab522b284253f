// Multi-process tests of the control plane: real connex-directory and connexctl binaries, killed
// with SIGKILL, stopped with SIGSTOP, and fed bad input (the fixture: directory_process_fixture.h;
// the table limits and floods: directory_process_limits_test.cc).
#include "tests/directory_process_fixture.h"

namespace connex::testing {
namespace {

TEST_F(DirectoryProcessTest, KilledHolderIsFailedWithinTheLease) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  std::string e = std::to_string(epoch);
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r0 epoch=" + e, 5000));
  holder.Signal(SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  std::optional<std::string> failed =
      watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + e, kLeaseTtlMs + 500);
  ASSERT_TRUE(failed.has_value()) << watcher.transcript();
  EXPECT_THAT(*failed, HasSubstr("reason=lease-expired"));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  killed)
                .count();
  RecordProperty("kill_to_failed_ms", std::to_string(ms));
  EXPECT_EQ(holder.Wait(1000), 128 + SIGKILL);
}

TEST_F(DirectoryProcessTest, StoppedHolderIsRefusedAfterItWasReplaced) {
  Subprocess watcher = Watcher();
  auto [old_holder, old_epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  old_holder.Signal(SIGSTOP);
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(old_epoch),
                                  kLeaseTtlMs + 2000));
  auto [replacement, new_epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:6666");
  EXPECT_GT(new_epoch, old_epoch);
  old_holder.Signal(SIGCONT);
  // Its next heartbeat is refused: it gives the LID up and exits 3.
  std::optional<std::string> lost = old_holder.WaitForLine("lost demo/g1/s0/r0", 5000);
  ASSERT_TRUE(lost.has_value()) << old_holder.transcript();
  EXPECT_THAT(*lost, HasSubstr("superseded by " + std::to_string(new_epoch)));
  EXPECT_EQ(old_holder.Wait(5000), 3);
  // The replacement keeps the LID.
  auto [code, out] = Run({"resolve", "demo", "1"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("demo/g1/s0/r0 epoch=" + std::to_string(new_epoch) +
                             " addresses=tcp://127.0.0.1:6666"));
}

TEST_F(DirectoryProcessTest, StoppedHolderComesBackUnderANewEpoch) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  holder.Signal(SIGSTOP);
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(epoch),
                                  kLeaseTtlMs + 2000));
  holder.Signal(SIGCONT);
  // The evicted epoch is refused; the live process joins again under a new one.
  std::optional<std::string> rejoined = holder.WaitForLine("rejoined demo/g1/s0/r0", 5000);
  ASSERT_TRUE(rejoined.has_value()) << holder.transcript();
  EXPECT_THAT(*rejoined, HasSubstr("previous_epoch=" + std::to_string(epoch)));
  std::optional<std::string> joined = watcher.WaitForLine("JOINED demo/g1/s0/r0", 5000);
  ASSERT_TRUE(joined.has_value());
  EXPECT_THAT(*joined, ::testing::Not(HasSubstr("epoch=" + std::to_string(epoch) + " ")));
  // The old epoch stays fenced.
  auto [code, out] =
      Run({"report-failed", "demo/g1/s0/r0", "--epoch", std::to_string(epoch)}, AdminEnv());
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("not evicted"));
}

TEST_F(DirectoryProcessTest, SigtermLeavesGracefully) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g2/s0/r1", "tcp://127.0.0.1:5555");
  holder.Signal(SIGTERM);
  ASSERT_TRUE(holder.WaitForLine("left demo/g2/s0/r1", 5000));
  EXPECT_EQ(holder.Wait(5000), 0);
  ASSERT_TRUE(watcher.WaitForLine("LEFT demo/g2/s0/r1 epoch=" + std::to_string(epoch), 5000));
}

TEST_F(DirectoryProcessTest, StatusResolveLeaveAndReportFailed) {
  auto [a, ea] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  auto [b, eb] = Join("demo/g1/s0/r1", "tcp://127.0.0.1:5556");
  auto [code, out] = Run({"status"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("LID"));
  EXPECT_THAT(out, HasSubstr("demo/g1/s0/r1"));
  auto [jcode, json_text] = Run({"resolve", "demo", "1", "--json"});
  EXPECT_EQ(jcode, 0);
  nlohmann::json records = nlohmann::json::parse(json_text);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["lid"], "demo/g1/s0/r0");
  EXPECT_EQ(records[0]["epoch"], ea);
  EXPECT_GT(records[1]["lease_left_ms"].get<int64_t>(), 0);

  Subprocess watcher = Watcher();
  auto [rcode, rout] = Run({"report-failed", "demo/g1/s0/r0"}, AdminEnv());
  EXPECT_EQ(rcode, 0) << rout;
  EXPECT_THAT(rout, HasSubstr("evicted demo/g1/s0/r0"));
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(ea), 5000));
  auto [lcode, lout] = Run({"leave", "demo/g1/s0/r1"}, AdminEnv());
  EXPECT_EQ(lcode, 0) << lout;
  ASSERT_TRUE(watcher.WaitForLine("LEFT demo/g1/s0/r1", 5000));
  // The drained holder learns it and stops claiming the LID.
  ASSERT_TRUE(b.WaitForLine("lost demo/g1/s0/r1", 5000)) << b.transcript();
  EXPECT_EQ(b.Wait(5000), 3);
}

// Finding 1 of issue 12: `connexctl join` of a live holder's LID took it over (the holder gave
// up, watchers saw FAILED then JOINED at the impostor's address), and a stranger's `leave` or
// `report-failed` removed a live holder.
TEST_F(DirectoryProcessTest, HijackOfALiveLidIsRefused) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  std::string e = std::to_string(epoch);
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r0 epoch=" + e, 5000));
  auto [c1, o1] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://6.6.6.6:666"});
  EXPECT_EQ(c1, 1);
  EXPECT_THAT(o1, HasSubstr("JOIN for demo/g1/s0/r0: held by epoch " + e + " (lease live"));
  auto [c2, o2] = Run({"leave", "demo/g1/s0/r0"});
  EXPECT_EQ(c2, 1);
  // Refused by the client before the directory is asked (a stranger holds no credential of it).
  EXPECT_THAT(o2, HasSubstr("a drain of demo/g1/s0/r0 needs the admin token"));
  auto [c3, o3] = Run({"report-failed", "demo/g1/s0/r0"});
  EXPECT_EQ(c3, 1);
  EXPECT_THAT(o3, HasSubstr("accepted only from a live member of model 'demo'"));
  // Forcing without (or with a wrong) admin token is refused too.
  auto [c4, o4] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://6.6.6.6:666", "--force"});
  EXPECT_EQ(c4, 1);
  EXPECT_THAT(o4, HasSubstr("needs the admin token"));
  auto [c5, o5] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://6.6.6.6:666", "--force"},
                      {"CONNEX_DIRECTORY_ADMIN_TOKEN=guess"});
  EXPECT_EQ(c5, 1);
  EXPECT_THAT(o5, HasSubstr("wrong admin token"));
  // The holder still holds the LID under its epoch, and nobody saw it fail.
  auto [code, out] = Run({"resolve", "demo", "1"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("demo/g1/s0/r0 epoch=" + e + " addresses=tcp://127.0.0.1:5555"));
  EXPECT_THAT(watcher.transcript(), ::testing::Not(HasSubstr("FAILED")));
  EXPECT_THAT(holder.transcript(), ::testing::Not(HasSubstr("lost")));
}

TEST_F(DirectoryProcessTest, ForcedTakeoverFencesTheHolder) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  auto [taker, new_epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:6666", {"--force"}, AdminEnv());
  EXPECT_GT(new_epoch, epoch);
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(epoch), 5000));
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r0 epoch=" + std::to_string(new_epoch), 5000));
  // The displaced holder's next heartbeat is refused: it says so and exits 3.
  std::optional<std::string> lost = holder.WaitForLine("lost demo/g1/s0/r0", 5000);
  ASSERT_TRUE(lost.has_value()) << holder.transcript();
  EXPECT_THAT(*lost, HasSubstr("superseded by " + std::to_string(new_epoch)));
  EXPECT_EQ(holder.Wait(5000), 3);
  // An admin token on argv does not exist: only a file or the environment.
  auto [c, o] = Run({"--admin-token", kAdminToken, "status"});
  EXPECT_EQ(c, 2);
}

void SendGarbage(const std::string& endpoint) {
  size_t colon = endpoint.rfind(':');
  int port = std::stoi(endpoint.substr(colon + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string junk(65536, '\x5a');
  ssize_t n = write(fd, junk.data(), junk.size());
  (void)n;
  close(fd);
}

TEST_F(DirectoryProcessTest, BadInputGetsClearErrorsAndTheDirectoryKeepsServing) {
  auto [a, ea] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  SendGarbage(bind_);
  SendGarbage(pub_);

  auto [c1, o1] = Run({"join", "demo/g1/s0", "--address", "tcp://x:1"});
  EXPECT_EQ(c1, 2);
  EXPECT_THAT(o1, HasSubstr("LID 'demo/g1/s0': expected 4 parts"));
  auto [c2, o2] = Run({"frobnicate"});
  EXPECT_EQ(c2, 2);
  EXPECT_THAT(o2, HasSubstr("unknown command 'frobnicate'"));
  auto [c3, o3] = Run({"resolve", "demo"});
  EXPECT_EQ(c3, 2);
  EXPECT_THAT(o3, HasSubstr("group is required"));
  auto [c4, o4] = Run({"join", "demo/g1/s0/r9", "--address", "no-scheme"});
  EXPECT_EQ(c4, 2);
  EXPECT_THAT(o4, HasSubstr("not self-describing"));
  auto [c5, o5] = Run({"status", "--timeout-ms", "abc"});
  EXPECT_EQ(c5, 2);

  // The directory survived all of it, with its table intact.
  auto [code, out] = Run({"status", "--json"});
  ASSERT_EQ(code, 0) << out;
  nlohmann::json status = nlohmann::json::parse(out);
  ASSERT_EQ(status["records"].size(), 1u);
  EXPECT_EQ(status["records"][0]["epoch"], ea);
  EXPECT_FALSE(directory_->Wait(0).has_value());  // still running
}

// Finding 4 of issue 12: a heartbeat period above the lease TTL was accepted.
TEST_F(DirectoryProcessTest, HeartbeatAboveTheLeaseIsRefusedAtStart) {
  auto p =
      Subprocess::Start({BinDir() + "/connex-directory", "--bind", "tcp://127.0.0.1:0", "--pub",
                         "tcp://127.0.0.1:0", "--lease-ttl-ms", "500", "--heartbeat-ms", "2000"},
                        {}, /*capture_stderr=*/true);
  ASSERT_TRUE(p.has_value());
  while (p->ReadLine(5000)) {
  }
  EXPECT_EQ(p->Wait(5000), 2);
  EXPECT_THAT(p->transcript(), HasSubstr("--heartbeat-ms 2000"));
  EXPECT_THAT(p->transcript(), HasSubstr("--lease-ttl-ms 500"));
  EXPECT_THAT(p->transcript(), ::testing::Not(HasSubstr("listening")));
}

// Protected mode: a directory on a non-loopback address (here every interface) without a CURVE
// key pair is refused at start, naming both ways out; with --insecure, or with a key pair, it
// starts. A client with the wrong key or none is refused by name (connexctl, exit 1).
TEST_F(DirectoryProcessTest, BeyondLoopbackOnlyWithCurveOrInsecure) {
  const std::string dir = ::testing::TempDir() + "/curve-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (std::string name : {"dir", "stranger"}) {
    auto keygen =
        Subprocess::Start({BinDir() + "/connexctl", "keygen", "--out", dir + "/" + name}, {}, true);
    ASSERT_TRUE(keygen.has_value());
    while (keygen->ReadLine(5000)) {
    }
    ASSERT_EQ(keygen->Wait(5000), 0) << keygen->transcript();
  }
  std::vector<std::string> argv = {BinDir() + "/connex-directory", "--bind", "tcp://0.0.0.0:0",
                                   "--pub", "tcp://127.0.0.1:0"};
  {
    auto p = Subprocess::Start(argv, {"CONNEX_INSECURE=0"}, true);
    ASSERT_TRUE(p.has_value());
    while (p->ReadLine(5000)) {
    }
    EXPECT_EQ(p->Wait(5000), 2);
    EXPECT_THAT(p->transcript(), HasSubstr("refusing to listen on '0.0.0.0'"));
    EXPECT_THAT(p->transcript(), HasSubstr("--insecure"));
    EXPECT_THAT(p->transcript(), HasSubstr("CONNEX_CURVE_KEY_FILE"));
  }
  {
    std::vector<std::string> insecure = argv;
    insecure.push_back("--insecure");
    auto p = Subprocess::Start(insecure, {}, true);
    ASSERT_TRUE(p.has_value());
    EXPECT_TRUE(p->WaitForLine("listening", 10000).has_value()) << p->transcript();
  }
  auto p = Subprocess::Start(argv, {"CONNEX_CURVE_KEY_FILE=" + dir + "/dir.key"}, true);
  ASSERT_TRUE(p.has_value());
  auto line = p->WaitForLine("listening", 10000);
  ASSERT_TRUE(line.has_value()) << p->transcript();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*line, m, std::regex("bind=tcp://0\\.0\\.0\\.0:([0-9]+)")));
  const std::string at = "tcp://127.0.0.1:" + std::string(m[1]);
  std::ifstream pub_file(dir + "/dir.pub");
  std::string dir_pub;
  std::getline(pub_file, dir_pub);
  auto status = [&](std::vector<std::string> env) {
    auto c = Subprocess::Start(
        {BinDir() + "/connexctl", "--directory", at, "--timeout-ms", "2000", "status"}, env, true);
    EXPECT_TRUE(c.has_value());
    while (c->ReadLine(5000)) {
    }
    return std::make_pair(c->Wait(5000).value_or(-1), c->transcript());
  };
  auto [ok_code, ok_out] = status({"CONNEX_CURVE_KEY_FILE=" + dir + "/dir.key"});
  EXPECT_EQ(ok_code, 0) << ok_out;
  auto [none_code, none_out] = status({});
  EXPECT_EQ(none_code, 1);
  EXPECT_THAT(none_out, HasSubstr("the directory requires CURVE"));
  auto [bad_code, bad_out] = status(
      {"CONNEX_CURVE_KEY_FILE=" + dir + "/stranger.key", "CONNEX_DIRECTORY_SERVER_KEY=" + dir_pub});
  EXPECT_EQ(bad_code, 1);
  EXPECT_THAT(bad_out, HasSubstr("not authorized"));
  EXPECT_TRUE(p->WaitForLine("not authorized", 5000).has_value()) << p->transcript();
  std::filesystem::remove_all(dir);
}

TEST_F(DirectoryProcessTest, NoDirectoryIsAClearError) {
  std::vector<std::string> argv = {BinDir() + "/connexctl", "--directory", "tcp://127.0.0.1:1",
                                   "--timeout-ms",          "300",         "status"};
  auto p = Subprocess::Start(argv, {}, true);
  ASSERT_TRUE(p.has_value());
  while (p->ReadLine(5000)) {
  }
  EXPECT_EQ(p->Wait(5000), 1);
  EXPECT_THAT(p->transcript(), HasSubstr("no answer within 300 ms"));
}

// Issue 23: with the default directory (no token), a stranger that JOINed any free LID became a
// "member" (its reports evicted live stages, it was routed steps). Out of the box connex-directory
// requires this user's default token, which it makes on its first start ($CONNEX_HOME, else
// ~/.connex); every client of the user reads it; `--insecure` serves anyone who can reach it.
TEST(SecureByDefaultTest, TheDefaultDirectoryRequiresTheTokenItMakesOnFirstStart) {
  const std::string root = ::testing::TempDir() + "/secure-default-" + std::to_string(getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string home = root + "/home", stranger = root + "/stranger";
  auto start = [](std::vector<std::string> extra, const std::string& connex_home) {
    std::vector<std::string> argv = {BinDir() + "/connex-directory", "--bind", "tcp://127.0.0.1:0",
                                     "--pub", "tcp://127.0.0.1:0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Subprocess::Start(argv, {"CONNEX_HOME=" + connex_home});
    EXPECT_TRUE(p.has_value());
    std::optional<std::string> line = p->WaitForLine("listening", 10000);
    EXPECT_TRUE(line.has_value());
    std::smatch m;
    std::string bind;
    if (line && std::regex_search(*line, m, std::regex("bind=(tcp://[0-9.:]+)"))) bind = m[1];
    return std::make_pair(std::move(*p), bind);
  };
  auto ctl = [](const std::string& bind, std::vector<std::string> args,
                const std::string& connex_home) {
    std::vector<std::string> argv = {BinDir() + "/connexctl", "--directory", bind};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = Subprocess::Start(argv, {"CONNEX_HOME=" + connex_home}, true);
    EXPECT_TRUE(p.has_value());
    while (p->ReadLine(10000)) {
    }
    return std::make_pair(p->Wait(10000).value_or(-1), p->transcript());
  };
  std::string token;
  {
    auto [directory, bind] = start({}, home);
    const std::string file = home + "/directory.token";
    ASSERT_TRUE(std::filesystem::exists(file));
    EXPECT_EQ(std::filesystem::status(file).permissions(),
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    EXPECT_EQ(std::filesystem::status(home).permissions(), std::filesystem::perms::owner_all);
    std::ifstream(file) >> token;
    EXPECT_GE(token.size(), 32u);
    // A stranger (no token) can neither join nor read the table.
    auto [refused, why] = ctl(bind, {"report-failed", "demo/g1/s0/r0"}, stranger);
    EXPECT_EQ(refused, 1) << why;
    EXPECT_THAT(why, HasSubstr("requires a token"));
    auto [unread, why2] = ctl(bind, {"status"}, stranger);
    EXPECT_EQ(unread, 1) << why2;
    // This user's clients read the default token.
    auto [ok, table] = ctl(bind, {"status"}, home);
    EXPECT_EQ(ok, 0) << table;
  }
  {
    // A second start keeps the token (clients and stages that run on keep working).
    auto [directory, bind] = start({}, home);
    std::string again;
    std::ifstream(home + "/directory.token") >> again;
    EXPECT_EQ(again, token);
    EXPECT_EQ(ctl(bind, {"status"}, home).first, 0);
  }
  {
    // --insecure: no token, anyone who can reach it is served (and no token file is made).
    auto [directory, bind] = start({"--insecure"}, stranger);
    auto [ok, table] = ctl(bind, {"status"}, stranger);
    EXPECT_EQ(ok, 0) << table;
    EXPECT_FALSE(std::filesystem::exists(stranger + "/directory.token"));
  }
  std::filesystem::remove_all(root);
}

TEST_F(TokenDirectoryTest, WrongTokenIsRefusedAndRightTokenWorks) {
  // A client with no token at all (no default one in its CONNEX_HOME either).
  const std::string no_home = "CONNEX_HOME=" + state_ + "/no-home";
  auto [c1, o1] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://127.0.0.1:1"}, {no_home});
  EXPECT_EQ(c1, 1);
  EXPECT_THAT(o1, HasSubstr("requires a token"));
  auto [c2, o2] = Run({"report-failed", "demo/g1/s0/r0"}, {"CONNEX_DIRECTORY_TOKEN=nope"});
  EXPECT_EQ(c2, 1);
  EXPECT_THAT(o2, HasSubstr("wrong directory token"));
  // A secret on the command line (where ps shows it) is a usage error naming the ways in.
  auto [c6, o6] = Run({"--token", "s3cret", "status"});
  EXPECT_EQ(c6, 2);
  EXPECT_THAT(o6, HasSubstr("never taken from the command line"));
  EXPECT_THAT(o6, HasSubstr("--token-file FILE or CONNEX_DIRECTORY_TOKEN"));
  Subprocess j = Ctl({"join", "demo/g1/s0/r0", "--address", "tcp://127.0.0.1:1"},
                     {"CONNEX_DIRECTORY_TOKEN=s3cret"});
  ASSERT_TRUE(j.WaitForLine("joined demo/g1/s0/r0", 5000)) << j.transcript();
  // The secret may come from a file instead of argv (where ps shows it).
  auto [c5, o5] = Run({"--token-file", state_ + "/token", "status"});
  EXPECT_EQ(c5, 0) << o5;
  EXPECT_THAT(o5, HasSubstr("demo/g1/s0/r0"));
  // Reading the table needs the token too.
  auto [c3, o3] = Run({"status"}, {no_home});
  EXPECT_EQ(c3, 1);
  EXPECT_THAT(o3, HasSubstr("SNAPSHOT: this directory requires a token"));
  auto [c4, o4] = Run({"status"}, {"CONNEX_DIRECTORY_TOKEN=s3cret"});
  EXPECT_EQ(c4, 0);
  EXPECT_THAT(o4, HasSubstr("demo/g1/s0/r0"));
}

}  // namespace
}  // namespace connex::testing
