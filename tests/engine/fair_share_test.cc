#include "engine/fair_share.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

// Serves `rounds` items of `chunk` tokens to whichever tenant FairShare picks, every tenant
// always having work; returns the tokens each got.
std::map<std::string, int64_t> Serve(FairShare& f, const std::vector<std::string>& tenants,
                                     int rounds, int64_t chunk) {
  std::map<std::string, int64_t> got;
  uint64_t arrival = 0;
  for (int r = 0; r < rounds; ++r) {
    f.BeginStep(tenants);
    std::vector<FairShare::Candidate> c;
    for (const std::string& t : tenants) c.push_back({&t, arrival++});
    const std::string& t = tenants[f.Pick(c)];
    f.Charge(t, chunk);
    got[t] += chunk;
  }
  return got;
}

TEST(FairShareTest, EqualWeightsAlternate) {
  FairShare f;
  const std::vector<std::string> t = {"a", "b"};
  const auto got = Serve(f, t, 100, 16);
  EXPECT_EQ(got.at("a"), 800);
  EXPECT_EQ(got.at("b"), 800);
}

// Weights 3 : 1 give tokens 3 : 1, to within one item.
TEST(FairShareTest, WeightsSetTheRatio) {
  FairShare f;
  f.SetWeight("heavy", 3);
  const std::vector<std::string> t = {"heavy", "light"};
  const auto got = Serve(f, t, 400, 10);
  EXPECT_NEAR(static_cast<double>(got.at("heavy")) / got.at("light"), 3.0, 0.05);
  EXPECT_EQ(f.Weight("light"), 1u);
}

// Ties go to the earlier arrival: a lone tenant, or equal service, keeps arrival order.
TEST(FairShareTest, TiesGoToTheEarlierArrival) {
  FairShare f;
  const std::string a = "a", b = "b";
  f.BeginStep({a, b});
  EXPECT_EQ(f.Pick({{&b, 7}, {&a, 3}}), 1u);
  EXPECT_EQ(f.Pick({{&b, 2}, {&a, 3}}), 0u);
}

// A tenant that was idle does not bank credit: it starts at the level of those that kept
// working, so it alternates with them instead of monopolising the next steps.
TEST(FairShareTest, IdlingBanksNoCredit) {
  FairShare f;
  const std::string busy = "busy", idle = "idle";
  for (int i = 0; i < 50; ++i) {
    f.BeginStep({busy});
    f.Charge(busy, 100);
  }
  f.BeginStep({busy, idle});
  EXPECT_EQ(f.Service(idle), f.Service(busy));
  // From there they alternate.
  const auto got = Serve(f, {busy, idle}, 10, 100);
  EXPECT_EQ(got.at("busy"), 500);
  EXPECT_EQ(got.at("idle"), 500);
}

}  // namespace
}  // namespace prefixd
