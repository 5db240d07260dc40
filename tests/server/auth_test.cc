#include "server/auth.h"

#include <sys/stat.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/process.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

TEST(AuthTest, AllowAllIsTheDefaultTenant) {
  Authenticator a = Authenticator::AllowAll();
  EXPECT_FALSE(a.enabled());
  EXPECT_EQ(*a.Authenticate(std::nullopt), kDefaultTenant);
  EXPECT_EQ(*a.Authenticate("Bearer anything"), kDefaultTenant);
}

TEST(AuthTest, MapsTokensToTenants) {
  absl::StatusOr<Authenticator> a =
      Authenticator::FromText("# comment\nsecret-a alice\n\n  secret-b\tbob  \n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->num_tokens(), 2u);
  EXPECT_EQ(*a->Authenticate("Bearer secret-a"), "alice");
  EXPECT_EQ(*a->Authenticate("Bearer secret-b"), "bob");
  EXPECT_EQ(*a->Authenticate("bearer secret-b"), "bob");  // the scheme is case-insensitive
}

TEST(AuthTest, RefusesMissingWrongAndPartialTokens) {
  absl::StatusOr<Authenticator> a = Authenticator::FromText("secret-a alice\n");
  ASSERT_TRUE(a.ok());
  for (const std::optional<std::string_view>& h : std::vector<std::optional<std::string_view>>{
           std::nullopt, "", "secret-a", "Basic secret-a", "Bearer secret", "Bearer secret-a ",
           "Bearer secret-ab", "Bearer alice"}) {
    absl::StatusOr<std::string> t = a->Authenticate(h);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnauthenticated)
        << (h.has_value() ? std::string(*h) : "<none>");
  }
}

TEST(AuthTest, AdminIsTheThirdColumn) {
  absl::StatusOr<Authenticator> a = Authenticator::FromText("tok-a alice admin\ntok-b bob\n");
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Caller> alice = a->Identify("Bearer tok-a");
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_TRUE(alice->admin);
  absl::StatusOr<Caller> bob = a->Identify("Bearer tok-b");
  ASSERT_TRUE(bob.ok());
  EXPECT_EQ(bob->tenant, "bob");
  EXPECT_FALSE(bob->admin);
  // Without a tokens file the one tenant is admin.
  EXPECT_TRUE(Authenticator::AllowAll().Identify(std::nullopt)->admin);
}

TEST(AuthTest, RejectsMalformedFiles) {
  EXPECT_THAT(std::string(Authenticator::FromText("a b\nonlytoken\n").status().message()),
              HasSubstr("line 2"));
  EXPECT_THAT(std::string(Authenticator::FromText("a b c\n").status().message()),
              HasSubstr("line 1: unknown field \"c\" (expected admin, weight=N"));
  EXPECT_THAT(std::string(Authenticator::FromText("a b admin d\n").status().message()),
              HasSubstr("line 1: unknown field \"d\""));
  EXPECT_THAT(std::string(Authenticator::FromText("t x\nt y\n").status().message()),
              HasSubstr("duplicate token"));
  EXPECT_EQ(Authenticator::FromText("# nothing\n\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// weight=, share= and max_waiting= are the tenant's policy, in any order after the tenant,
// each checked against its range; a tenant's lines may add to its policy, not contradict it.
TEST(AuthTest, ReadsTenantPolicies) {
  absl::StatusOr<Authenticator> a = Authenticator::FromText(
      "t1 quiet weight=3 share=0.25\n"
      "t2 noisy max_waiting=8 admin\n"
      "t3 quiet max_waiting=2\n"
      "t4 quiet weight=3\n"
      "t5 plain\n");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->policies().size(), 3u);
  EXPECT_EQ(a->policies()[0],
            (TenantPolicy{.name = "quiet", .weight = 3, .cache_share = 0.25, .max_waiting = 2}));
  EXPECT_EQ(a->policies()[1], (TenantPolicy{.name = "noisy", .max_waiting = 8}));
  EXPECT_EQ(a->policies()[2], (TenantPolicy{.name = "plain"}));
  EXPECT_TRUE(a->Identify("Bearer t2")->admin);
  EXPECT_TRUE(Authenticator::AllowAll().policies().empty());

  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"t q weight=0\n", "weight must be an integer in [1, 1000], got \"0\""},
           {"t q weight=2.5\n", "weight must be an integer"},
           {"t q share=0\n", "share must be a fraction of the pool in (0, 1], got \"0\""},
           {"t q share=1.5\n", "share must be a fraction"},
           {"t q max_waiting=-1\n", "max_waiting must be a count of requests >= 0"},
           {"t q weight=2\nu q weight=3\n", "line 2: tenant \"q\" has another weight"},
           {"t q share=0.5\nu q share=0.2\n", "line 2: tenant \"q\" has another"},
       }) {
    EXPECT_THAT(std::string(Authenticator::FromText(text).status().message()), HasSubstr(why))
        << text;
  }
}

TEST(AuthTest, ReadsAFile) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/tokens";
  std::ofstream(path) << "tok1 t1\ntok2 t2\n";
  absl::StatusOr<Authenticator> a = Authenticator::FromFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a->Authenticate("Bearer tok2"), "t2");
  EXPECT_EQ(Authenticator::FromFile(dir.path() + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

// A FIFO nobody writes is refused at once, saying what it is (reading it would block
// start-up, or a SIGHUP reload, for good).
TEST(AuthTest, AFifoIsRefusedNotWaitedOn) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/tokens";
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<Authenticator> a = Authenticator::FromFile(path);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(std::string(a.status().message()), ::testing::HasSubstr("auth tokens file"));
  EXPECT_THAT(std::string(a.status().message()), ::testing::HasSubstr("FIFO"));
}

}  // namespace
}  // namespace prefixd
