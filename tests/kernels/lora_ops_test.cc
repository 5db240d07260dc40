// AddLoraUpdateRow against its scalar twin, with ==, over ranks and widths that exercise
// every tail (k not a multiple of the chains, outputs not a multiple of the block).
#include "kernels/cpu/lora_ops.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(LoraOpsTest, MatchesTheScalarTwinBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int32_t rank : {1, 3, 8, 13, 64}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {64, 192}, {36, 144},
                           {767, 129}, {3072, 768}}) {
      LoraModule m;
      m.in = in;
      m.out = out;
      m.a_t.resize(in * rank);
      m.b_t.resize(rank * out);
      for (float& v : m.a_t) v = n(rng);
      for (float& v : m.b_t) v = n(rng);
      std::vector<float> x(in), y(out);
      for (float& v : x) v = n(rng);
      for (float& v : y) v = n(rng);
      std::vector<float> want = y, got = y;
      std::vector<float> scratch(kLoraChains * rank, std::nanf(""));  // overwritten first
      AddLoraUpdateRow(m, rank, 0.75f, x.data(), got.data(), scratch.data());
      AddLoraUpdateRowReference(m, rank, 0.75f, x.data(), want.data());
      EXPECT_EQ(got, want) << "rank " << rank << " in " << in << " out " << out;
      EXPECT_NE(got, y);
    }
  }
}

TEST(LoraOpsTest, ZeroBLeavesYUnchanged) {
  LoraModule m;
  m.in = 10;
  m.out = 70;
  m.a_t.assign(10 * 4, 0.5f);
  m.b_t.assign(4 * 70, 0.0f);
  std::vector<float> x(10, 1.0f), y(70);
  for (int i = 0; i < 70; ++i) y[i] = 0.1f * i - 3.0f;
  std::vector<float> before = y, scratch(kLoraChains * 4);
  AddLoraUpdateRow(m, 4, 2.0f, x.data(), y.data(), scratch.data());
  EXPECT_EQ(y, before);
}

}  // namespace
}  // namespace prefixd
