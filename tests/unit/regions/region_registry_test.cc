// RegionRegistry and RegionSocketServer: what is mapped, who sees it, the
// limits, and when a region's memory goes.
#include "server/regions/region_registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/region_protocol.h"
#include "server/regions/region_socket_server.h"

namespace optstate {
namespace {

namespace rp = region_protocol;

// A memfd of `bytes` with `seals` added (no F_SEAL_SEAL, so tests can
// choose); filled with a pattern.
int Memfd(uint64_t bytes, int seals) {
  const int fd = memfd_create("test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  std::vector<char> pattern(bytes);
  for (size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<char>(i * 7 + 1);
  EXPECT_EQ(pwrite(fd, pattern.data(), bytes, 0), static_cast<ssize_t>(bytes));
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
  }
  return fd;
}

TEST(RegionRegistry, MapsASealedMemfdAndSharesItsBytes) {
  RegionRegistry registry(RegionLimits{});
  const std::string key = registry.OpenSession("");
  const int fd = Memfd(8192, F_SEAL_SHRINK);
  const int mine = dup(fd);
  absl::StatusOr<std::shared_ptr<const MappedRegion>> region = registry.Register(key, fd);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->bytes(), 8192u);
  EXPECT_EQ(registry.mapped_bytes(), 8192u);
  absl::StatusOr<std::shared_ptr<const MappedRegion>> found =
      registry.Find("", key, (*region)->id());
  ASSERT_TRUE(found.ok());
  absl::StatusOr<char*> at = (*found)->Slice(100, 50, "test");
  ASSERT_TRUE(at.ok());
  for (int i = 0; i < 50; ++i) EXPECT_EQ((*at)[i], static_cast<char>((100 + i) * 7 + 1));
  // What the daemon writes, the client's own view of the file sees.
  (*at)[0] = 42;
  char read_back = 0;
  ASSERT_EQ(pread(mine, &read_back, 1, 100), 1);
  EXPECT_EQ(read_back, 42);
  close(mine);
}

TEST(RegionRegistry, RefusesAFileThatCanShrink) {
  RegionRegistry registry(RegionLimits{});
  const std::string key = registry.OpenSession("");
  // No seal, only F_SEAL_GROW, and a plain file that cannot be sealed.
  for (int seals : {0, F_SEAL_GROW}) {
    const int fd = Memfd(4096, seals);
    absl::StatusOr<std::shared_ptr<const MappedRegion>> region = registry.Register(key, fd);
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument) << seals;
    EXPECT_NE(region.status().message().find("F_SEAL_SHRINK"), std::string::npos);
    EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "the fd is closed whatever the outcome";
  }
  FILE* plain = tmpfile();
  ASSERT_NE(plain, nullptr);
  const int plain_fd = dup(fileno(plain));
  fclose(plain);
  EXPECT_EQ(registry.Register(key, plain_fd).status().code(), absl::StatusCode::kInvalidArgument);
  // A memfd made without MFD_ALLOW_SEALING can never carry the seal: said so.
  const int unsealable = memfd_create("optstate-test", MFD_CLOEXEC);
  ASSERT_GE(unsealable, 0);
  ASSERT_EQ(ftruncate(unsealable, 4096), 0);
  absl::Status refused = registry.Register(key, unsealable).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("made without MFD_ALLOW_SEALING"), std::string::npos)
      << refused;
  // Write-sealed: the daemon could not write params into it.
  const int sealed = Memfd(4096, F_SEAL_SHRINK | F_SEAL_WRITE);
  EXPECT_EQ(registry.Register(key, sealed).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.num_regions(), 0u);
  EXPECT_EQ(registry.mapped_bytes(), 0u);
}

TEST(RegionRegistry, EveryReferenceIsBoundsChecked) {
  RegionRegistry registry(RegionLimits{});
  const std::string key = registry.OpenSession("");
  auto region = registry.Register(key, Memfd(4096, F_SEAL_SHRINK));
  ASSERT_TRUE(region.ok());
  EXPECT_TRUE((*region)->Slice(0, 4096, "x").ok());
  EXPECT_TRUE((*region)->Slice(4096, 0, "x").ok());
  EXPECT_EQ((*region)->Slice(1, 4096, "x").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*region)->Slice(4097, 0, "x").status().code(), absl::StatusCode::kOutOfRange);
  // Offsets and lengths whose sum wraps around.
  EXPECT_EQ((*region)->Slice(UINT64_MAX - 1, 4, "x").status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*region)->Slice(8, UINT64_MAX - 4, "x").status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_NE((*region)->Slice(1, 4096, "gradient_region").status().message().find("4096 bytes"),
            std::string::npos);
  // A wrapping reference is told as sent, not as a wrapped end.
  EXPECT_NE((*region)
                ->Slice(UINT64_MAX - 15, 4000, "x")
                .status()
                .message()
                .find("4000 bytes at offset 18446744073709551600"),
            std::string::npos);
}

TEST(RegionRegistry, ARegionIsInvisibleToOtherSessionsAndTenants) {
  RegionRegistry registry(RegionLimits{});
  const std::string a = registry.OpenSession("");
  const std::string b = registry.OpenSession("");
  const std::string other_tenant = registry.OpenSession("t2");
  auto region = registry.Register(a, Memfd(4096, F_SEAL_SHRINK));
  ASSERT_TRUE(region.ok());
  const uint64_t id = (*region)->id();
  EXPECT_TRUE(registry.Find("", a, id).ok());
  EXPECT_EQ(registry.Find("", b, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Find("t2", a, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Find("t2", other_tenant, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Find("", "", id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Unregister(b, id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.Find("", a, id).ok()) << "another session cannot unregister it";
}

TEST(RegionRegistry, ASessionKeepsObjectsForItsTenantUntilItEnds) {
  RegionRegistry registry(RegionLimits{});
  const std::string a = registry.OpenSession("");
  const std::string b = registry.OpenSession("");
  auto first = std::make_shared<const int>(1);
  std::weak_ptr<const int> first_alive = first;
  ASSERT_TRUE(registry.Keep("", a, 1, first, 100).ok());
  first.reset();
  absl::StatusOr<std::shared_ptr<const void>> kept = registry.Kept("", a, 1);
  ASSERT_TRUE(kept.ok());
  ASSERT_NE(*kept, nullptr);
  EXPECT_EQ(*std::static_pointer_cast<const int>(*kept), 1);
  kept = absl::StatusOr<std::shared_ptr<const void>>();
  // Another number of the session: none; another session, tenant or key:
  // NOT_FOUND, as Find answers, and nothing is kept for them.
  ASSERT_TRUE(registry.Kept("", a, 2).ok());
  EXPECT_EQ(*registry.Kept("", a, 2), nullptr);
  EXPECT_EQ(*registry.Kept("", b, 1), nullptr);
  EXPECT_EQ(registry.Kept("t2", a, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Keep("t2", a, 1, std::make_shared<const int>(5), 100).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Keep("", "no such key", 1, std::make_shared<const int>(5), 100).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*std::static_pointer_cast<const int>(*registry.Kept("", a, 1)), 1);
  // Kept again under its number: replaced, the old object gone.
  ASSERT_TRUE(registry.Keep("", a, 1, std::make_shared<const int>(11), 100).ok());
  EXPECT_TRUE(first_alive.expired());
  EXPECT_EQ(*std::static_pointer_cast<const int>(*registry.Kept("", a, 1)), 11);
  // Past kMaxKeptPerSession the least recently kept or looked up goes: 2 is
  // kept first, 1 is looked up after it, then 3 to 9 are kept.
  ASSERT_TRUE(registry.Keep("", a, 2, std::make_shared<const int>(2), 100).ok());
  ASSERT_NE(*registry.Kept("", a, 1), nullptr);
  for (uint64_t n = 3; n <= RegionRegistry::kMaxKeptPerSession + 1; ++n) {
    ASSERT_TRUE(
        registry.Keep("", a, n, std::make_shared<const int>(static_cast<int>(n)), 100).ok());
  }
  EXPECT_EQ(*registry.Kept("", a, 2), nullptr) << "the least recently used";
  EXPECT_NE(*registry.Kept("", a, 1), nullptr);
  EXPECT_EQ(registry.Stats().kept, RegionRegistry::kMaxKeptPerSession);
  registry.Unkeep("", a, 1);
  EXPECT_EQ(*registry.Kept("", a, 1), nullptr);
  // The session's end takes its objects.
  auto last = std::make_shared<const int>(42);
  std::weak_ptr<const int> last_alive = last;
  ASSERT_TRUE(registry.Keep("", b, 1, std::move(last), 100).ok());
  registry.CloseSession(b);
  EXPECT_TRUE(last_alive.expired());
  EXPECT_EQ(registry.Kept("", b, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Stats().kept, RegionRegistry::kMaxKeptPerSession - 1);
  EXPECT_EQ(registry.Stats().kept_bytes, 100 * (RegionRegistry::kMaxKeptPerSession - 1));
}

TEST(RegionRegistry, KeptObjectsOfAllSessionsStayWithinTheirBytes) {
  RegionLimits limits;
  limits.max_kept_bytes = 1000;
  RegionRegistry registry(limits);
  const std::string a = registry.OpenSession("");
  const std::string b = registry.OpenSession("");
  ASSERT_TRUE(registry.Keep("", a, 1, std::make_shared<const int>(1), 400).ok());
  ASSERT_TRUE(registry.Keep("", b, 1, std::make_shared<const int>(2), 400).ok());
  // a's second object takes the bytes of the least recently used anywhere: a's first.
  ASSERT_TRUE(registry.Keep("", a, 2, std::make_shared<const int>(3), 400).ok());
  EXPECT_EQ(*registry.Kept("", a, 1), nullptr);
  EXPECT_NE(*registry.Kept("", b, 1), nullptr);
  EXPECT_NE(*registry.Kept("", a, 2), nullptr);
  EXPECT_EQ(registry.Stats().kept_bytes, 800u);
  // Larger than all the sessions may keep: refused, nothing pushed out.
  EXPECT_EQ(registry.Keep("", b, 2, std::make_shared<const int>(4), 1001).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry.Stats().kept, 2u);
  EXPECT_EQ(registry.Stats().kept_bytes, 800u);
  registry.CloseSession(a);
  EXPECT_EQ(registry.Stats().kept_bytes, 400u);
}

TEST(RegionRegistry, LimitsRegionsPerClientAndBytesMapped) {
  RegionRegistry registry(RegionLimits{2, 3 * 4096});
  const std::string a = registry.OpenSession("");
  const std::string b = registry.OpenSession("");
  ASSERT_TRUE(registry.Register(a, Memfd(4096, F_SEAL_SHRINK)).ok());
  ASSERT_TRUE(registry.Register(a, Memfd(4096, F_SEAL_SHRINK)).ok());
  absl::Status third = registry.Register(a, Memfd(4096, F_SEAL_SHRINK)).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("--max_regions_per_client=2"), std::string::npos) << third;
  absl::Status big = registry.Register(b, Memfd(2 * 4096, F_SEAL_SHRINK)).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("--max_region_bytes"), std::string::npos) << big;
  EXPECT_TRUE(registry.Register(b, Memfd(4096, F_SEAL_SHRINK)).ok());
  EXPECT_EQ(registry.mapped_bytes(), 3u * 4096);
}

TEST(RegionRegistry, LimitsRegionsOfAllClientsTogether) {
  RegionRegistry registry(RegionLimits{16, 1 << 30, 3});
  const std::string a = registry.OpenSession("");
  const std::string b = registry.OpenSession("");
  auto first = registry.Register(a, Memfd(4096, F_SEAL_SHRINK));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(registry.Register(a, Memfd(4096, F_SEAL_SHRINK)).ok());
  ASSERT_TRUE(registry.Register(b, Memfd(4096, F_SEAL_SHRINK)).ok());
  absl::Status fourth = registry.Register(b, Memfd(4096, F_SEAL_SHRINK)).status();
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.message().find("--max_regions=3"), std::string::npos) << fourth;
  // Room again once one is unregistered, and once a session closes.
  ASSERT_TRUE(registry.Unregister(a, (*first)->id()).ok());
  EXPECT_TRUE(registry.Register(b, Memfd(4096, F_SEAL_SHRINK)).ok());
  registry.CloseSession(b);
  EXPECT_TRUE(registry.Register(a, Memfd(4096, F_SEAL_SHRINK)).ok());
  EXPECT_TRUE(registry.Register(a, Memfd(4096, F_SEAL_SHRINK)).ok());
  EXPECT_EQ(registry.Register(a, Memfd(4096, F_SEAL_SHRINK)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// A tenant's regions over all its connections (sessions): neither many
// connections nor one large region takes more than its share, and another
// tenant registers meanwhile.
TEST(RegionRegistry, LimitsRegionsAndTheirBytesPerTenant) {
  RegionLimits limits;
  limits.max_regions_per_tenant = 3;
  limits.max_region_bytes_per_tenant = 4 * 4096;
  RegionRegistry registry(limits);
  std::vector<std::string> a;
  for (int i = 0; i < 4; ++i) a.push_back(registry.OpenSession("a"));
  const std::string b = registry.OpenSession("b");
  auto first = registry.Register(a[0], Memfd(4096, F_SEAL_SHRINK));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(registry.Register(a[1], Memfd(4096, F_SEAL_SHRINK)).ok());
  ASSERT_TRUE(registry.Register(a[2], Memfd(4096, F_SEAL_SHRINK)).ok());
  absl::Status fourth = registry.Register(a[3], Memfd(4096, F_SEAL_SHRINK)).status();
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.message().find("tenant 'a' has 3 regions registered, the most "
                                  "--tenant_max_regions=3 allows"),
            std::string::npos)
      << fourth;
  ASSERT_TRUE(registry.Register(b, Memfd(4 * 4096, F_SEAL_SHRINK)).ok());  // Another tenant.
  // Room again once one is unregistered; bytes counted over the sessions.
  ASSERT_TRUE(registry.Unregister(a[0], (*first)->id()).ok());
  absl::Status large = registry.Register(a[3], Memfd(3 * 4096, F_SEAL_SHRINK)).status();
  EXPECT_EQ(large.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(large.message().find("does not fit tenant 'a': it has 8192 of "
                                 "--tenant_max_region_bytes=16384"),
            std::string::npos)
      << large;
  EXPECT_TRUE(registry.Register(a[3], Memfd(2 * 4096, F_SEAL_SHRINK)).ok());
  // A closed session gives its tenant's room back.
  registry.CloseSession(a[3]);
  registry.CloseSession(a[1]);
  EXPECT_TRUE(registry.Register(a[0], Memfd(3 * 4096, F_SEAL_SHRINK)).ok());
  EXPECT_EQ(registry.Register(b, Memfd(4096, F_SEAL_SHRINK)).status().code(),
            absl::StatusCode::kResourceExhausted);  // b holds its 4 pages.
}

TEST(RegionRegistry, AnUnregisteredRegionStaysMappedForTheStepUsingIt) {
  RegionRegistry registry(RegionLimits{});
  const std::string key = registry.OpenSession("");
  auto registered = registry.Register(key, Memfd(4096, F_SEAL_SHRINK));
  ASSERT_TRUE(registered.ok());
  const uint64_t id = (*registered)->id();
  registered = absl::StatusOr<std::shared_ptr<const MappedRegion>>();
  std::shared_ptr<const MappedRegion> in_use = *registry.Find("", key, id);  // A step holds it.
  ASSERT_TRUE(registry.Unregister(key, id).ok());
  EXPECT_EQ(registry.Find("", key, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.mapped_bytes(), 4096u) << "still mapped while used";
  absl::StatusOr<char*> at = in_use->Slice(0, 4096, "x");
  ASSERT_TRUE(at.ok());
  EXPECT_EQ((*at)[10], static_cast<char>(10 * 7 + 1));
  in_use.reset();
  EXPECT_EQ(registry.mapped_bytes(), 0u) << "unmapped when the step lets go";
}

TEST(RegionRegistry, StatsCountSessionsRegionsAndBytesThroughTheirLifetimes) {
  RegionRegistry registry(RegionLimits{});
  const std::string a = registry.OpenSession("");
  const std::string b = registry.OpenSession("");
  auto first = registry.Register(a, Memfd(4096, F_SEAL_SHRINK));
  auto second = registry.Register(a, Memfd(8192, F_SEAL_SHRINK));
  auto third = registry.Register(b, Memfd(16384, F_SEAL_SHRINK));
  ASSERT_TRUE(first.ok() && second.ok() && third.ok());
  const uint64_t first_id = (*first)->id();
  std::shared_ptr<const MappedRegion> in_use = *first;  // A step holds it.
  first = second = third = absl::StatusOr<std::shared_ptr<const MappedRegion>>();
  RegionRegistryStats stats = registry.Stats();
  EXPECT_EQ(stats.sessions, 2u);
  EXPECT_EQ(stats.regions, 3u);
  EXPECT_EQ(stats.registered_bytes, 28672u);
  EXPECT_EQ(stats.mapped_bytes, 28672u);
  EXPECT_EQ(stats.registrations, 3u);
  ASSERT_TRUE(registry.Unregister(a, first_id).ok());
  stats = registry.Stats();
  EXPECT_EQ(stats.regions, 2u);
  EXPECT_EQ(stats.registered_bytes, 24576u);
  EXPECT_EQ(stats.mapped_bytes, 28672u) << "the unregistered one is still in use";
  in_use.reset();
  EXPECT_EQ(registry.Stats().mapped_bytes, 24576u);
  registry.CloseSession(a);
  stats = registry.Stats();
  EXPECT_EQ(stats.sessions, 1u);
  EXPECT_EQ(stats.regions, 1u);
  EXPECT_EQ(stats.registered_bytes, 16384u);
  EXPECT_EQ(stats.mapped_bytes, 16384u);
  registry.CloseSession(b);
  stats = registry.Stats();
  EXPECT_EQ(stats.sessions, 0u);
  EXPECT_EQ(stats.regions, 0u);
  EXPECT_EQ(stats.registered_bytes, 0u);
  EXPECT_EQ(stats.mapped_bytes, 0u);
  EXPECT_EQ(stats.registrations, 3u) << "counted since the start";
}

TEST(RegionRegistry, ClosingASessionUnmapsItsRegions) {
  RegionRegistry registry(RegionLimits{});
  const std::string key = registry.OpenSession("");
  ASSERT_TRUE(registry.Register(key, Memfd(4096, F_SEAL_SHRINK)).ok());
  ASSERT_TRUE(registry.Register(key, Memfd(8192, F_SEAL_SHRINK)).ok());
  EXPECT_EQ(registry.mapped_bytes(), 12288u);
  registry.CloseSession(key);
  EXPECT_EQ(registry.mapped_bytes(), 0u);
  EXPECT_EQ(registry.num_sessions(), 0u);
  EXPECT_EQ(registry.Register(key, Memfd(4096, F_SEAL_SHRINK)).status().code(),
            absl::StatusCode::kNotFound);
}

// Waits up to 5 s for `done`.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 500; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

class RegionSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/optstate-region-test-" + std::to_string(getpid()) + ".sock";
    auto server = RegionSocketServer::Start(path_, 0600, &registry_, std::string(16, 'D'));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  RegionRegistry registry_{RegionLimits{}};
  std::string path_;
  std::unique_ptr<RegionSocketServer> server_;
};

TEST_F(RegionSocketTest, RegistersOverTheSocketAndForgetsWhenTheClientGoes) {
  rp::Reply hello;
  absl::StatusOr<int> socket = rp::Connect(path_, &hello);
  ASSERT_TRUE(socket.ok()) << socket.status();
  EXPECT_EQ(std::string(reinterpret_cast<char*>(hello.daemon_id), 16), std::string(16, 'D'));
  const std::string key(reinterpret_cast<char*>(hello.session_key), 16);
  absl::StatusOr<int> fd = rp::CreateSealedMemfd("r", 1 << 20);
  ASSERT_TRUE(fd.ok());
  rp::Request request;
  request.op = static_cast<uint32_t>(rp::Op::kRegister);
  absl::StatusOr<rp::Reply> reply = rp::Call(*socket, request, *fd);
  close(*fd);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(rp::StatusOf(*reply).ok()) << rp::StatusOf(*reply);
  EXPECT_EQ(reply->bytes, 1u << 20);
  EXPECT_TRUE(registry_.Find("", key, reply->region).ok());
  EXPECT_EQ(registry_.mapped_bytes(), 1u << 20);

  // Register without an fd; an unknown op; unregister.
  reply = rp::Call(*socket, request);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(rp::StatusOf(*reply).code(), absl::StatusCode::kInvalidArgument);
  rp::Request unknown;
  unknown.op = 99;
  reply = rp::Call(*socket, unknown);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(rp::StatusOf(*reply).code(), absl::StatusCode::kInvalidArgument);

  close(*socket);
  EXPECT_TRUE(Eventually([&] { return registry_.num_sessions() == 0; }));
  // The session goes first, under the registry's lock; its regions are
  // unmapped just after, outside it (CloseSession).
  EXPECT_TRUE(Eventually([&] { return registry_.mapped_bytes() == 0; }));
}

TEST_F(RegionSocketTest, RefusesAMemfdWithoutTheShrinkSealAndExtraFds) {
  rp::Reply hello;
  absl::StatusOr<int> socket = rp::Connect(path_, &hello);
  ASSERT_TRUE(socket.ok());
  const int unsealed = Memfd(4096, 0);
  rp::Request request;
  request.op = static_cast<uint32_t>(rp::Op::kRegister);
  absl::StatusOr<rp::Reply> reply = rp::Call(*socket, request, unsealed);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(rp::StatusOf(*reply).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rp::StatusOf(*reply).message().find("F_SEAL_SHRINK"), std::string::npos);
  close(unsealed);

  // Two fds in one record: refused, both closed on the daemon's side.
  const int a = Memfd(4096, F_SEAL_SHRINK), b = Memfd(4096, F_SEAL_SHRINK);
  struct iovec iov {
    &request, sizeof(request)
  };
  alignas(struct cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(2 * sizeof(int));
  int fds[2] = {a, b};
  std::memcpy(CMSG_DATA(cmsg), fds, sizeof(fds));
  ASSERT_EQ(sendmsg(*socket, &msg, 0), static_cast<ssize_t>(sizeof(request)));
  rp::Reply refused;
  ASSERT_TRUE(rp::Receive(*socket, &refused, sizeof(refused), nullptr).ok());
  EXPECT_EQ(rp::StatusOf(refused).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.num_regions(), 0u);
  close(a);
  close(b);
  close(*socket);
}

TEST(RegionProtocol, ARecordOfTheWrongLengthIsRefusedWithItsLength) {
  // A longer record was reported by the length read: "must be 16 bytes; got 16 bytes".
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  const std::string longer(sizeof(rp::Request) + 100, 'x');
  ASSERT_EQ(send(pair[0], longer.data(), longer.size(), 0), static_cast<ssize_t>(longer.size()));
  rp::Request request;
  const absl::Status status = rp::Receive(pair[1], &request, sizeof(request), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(absl::StrCat("got ", longer.size(), " bytes")), std::string::npos)
      << status.message();
  close(pair[0]);
  close(pair[1]);
}

TEST_F(RegionSocketTest, ASecondServerOnALiveSocketIsRefused) {
  RegionRegistry other{RegionLimits{}};
  auto second = RegionSocketServer::Start(path_, 0600, &other, std::string(16, 'E'));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace optstate
