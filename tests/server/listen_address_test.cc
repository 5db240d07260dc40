#include "server/listen_address.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

TEST(ListenAddressTest, ReadsEveryFormOnce) {
  absl::StatusOr<ListenAddress> a =
      ParseListenAddress("--listen", "127.0.0.1:50051", UnixSockets::kAllow);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kind, ListenAddress::Kind::kTcp);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 50051);
  EXPECT_EQ(a->WithPort(7), "127.0.0.1:7");

  a = ParseListenAddress("--listen", "[::1]:0", UnixSockets::kAllow);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 0);
  EXPECT_EQ(a->WithPort(80), "[::1]:80");

  a = ParseListenAddress("--listen", ":8000", UnixSockets::kAllow);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "");

  a = ParseListenAddress("--listen", "unix:///run/p.sock", UnixSockets::kAllow);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kind, ListenAddress::Kind::kUnix);
  EXPECT_EQ(a->path, "/run/p.sock");
  a = ParseListenAddress("--listen", "unix:rel.sock", UnixSockets::kAllow);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->path, "rel.sock");
  a = ParseListenAddress("--listen", "unix-abstract:prefixd", UnixSockets::kAllow);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, ListenAddress::Kind::kUnixAbstract);
  EXPECT_EQ(a->path, "prefixd");
}

TEST(ListenAddressTest, RefusesWhatIsNotAnAddressNamingTheFlag) {
  for (const char* bad : {"", "8000", "localhost", "::1:80", "[::1:80", "h:", "h:65536", "h:-1",
                          "h:+80", "h: 80", "h:80 ", "h:0x50", "unix:", "unix-abstract:"}) {
    absl::StatusOr<ListenAddress> a = ParseListenAddress("--http-listen", bad, UnixSockets::kAllow);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(a.status().message(), HasSubstr("--http-listen")) << bad;
  }
  absl::StatusOr<ListenAddress> a =
      ParseListenAddress("--metrics-listen", "unix:/tmp/x.sock", UnixSockets::kRefuse);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("HOST:PORT only"));
}

TEST(ListenAddressTest, PortZeroIsSharedByEverySocketOfTheAddress) {
  absl::StatusOr<ListenAddress> a =
      ParseListenAddress("--listen", "localhost:0", UnixSockets::kAllow);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<std::vector<SocketAddress>> resolved = ResolveListenAddress("--listen", *a);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ASSERT_FALSE(resolved->empty());
  absl::StatusOr<ListenSockets> s = Listen(*a, 16);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->port, 0);
  EXPECT_GE(s->fds.size(), 1u);
  for (int fd : s->fds) {
    SocketAddress bound;
    bound.length = sizeof(bound.storage);
    ASSERT_EQ(getsockname(fd, bound.get(), &bound.length), 0);
    EXPECT_THAT(bound.ToString(), ::testing::EndsWith(":" + std::to_string(s->port)));
  }
  // The port is held: a second listener on it is refused, naming the address.
  ListenAddress same = *a;
  same.port = s->port;
  absl::StatusOr<ListenSockets> again = Listen(same, 16);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.status().message(), HasSubstr("cannot listen on localhost:"));
  for (int fd : s->fds) close(fd);
}

TEST(ListenAddressTest, AnUnresolvableHostIsNamed) {
  ListenAddress a;
  a.host = "no-such-host.invalid";
  absl::StatusOr<std::vector<SocketAddress>> r = ResolveListenAddress("--http-listen", a);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("--http-listen no-such-host.invalid:0"));
}

}  // namespace
}  // namespace prefixd
