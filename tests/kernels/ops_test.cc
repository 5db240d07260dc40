// Row kernels against double-precision twins (tolerance stated per test), and the paged
// attention's independence from where the blocks live.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(OpsTest, ExpIsWithinFourUlpOfStdExpAndSameInTails) {
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  std::vector<float> got = xs;
  ExpInPlace(got.data(), static_cast<int64_t>(got.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = std::exp(static_cast<double>(xs[i]));
    ASSERT_NEAR(got[i], want, 4 * std::numeric_limits<float>::epsilon() * want) << xs[i];
  }
  // Any element gives the same value whether it sits in a full group of 8 or in a tail.
  for (size_t n = 1; n <= 9; ++n) {
    std::vector<float> part(xs.begin() + 100, xs.begin() + 100 + n);
    ExpInPlace(part.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(part[i], got[100 + i]);
  }
  float big[2] = {-1000.0f, 0.0f};
  ExpInPlace(big, 2);
  EXPECT_GE(big[0], 0.0f);
  EXPECT_LT(big[0], 1e-37f);
  EXPECT_EQ(big[1], 1.0f);
}

TEST(OpsTest, LayerNormMatchesDoubleWithin1e5Relative) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.5f, 2.0f);
  for (int64_t n : {1, 5, 8, 13, 64, 768}) {
    std::vector<float> x(n), g(n), b(n), out(n);
    for (int64_t i = 0; i < n; ++i) x[i] = dist(rng), g[i] = dist(rng), b[i] = dist(rng);
    LayerNormRow(x.data(), n, g.data(), b.data(), 1e-5f, out.data());
    double mean = 0, var = 0;
    for (float v : x) mean += v;
    mean /= n;
    for (float v : x) var += (v - mean) * (v - mean);
    var /= n;
    for (int64_t i = 0; i < n; ++i) {
      const double want = (x[i] - mean) / std::sqrt(var + 1e-5) * g[i] + b[i];
      ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::abs(want))) << "n=" << n << " i=" << i;
    }
  }
}

TEST(OpsTest, GeluNewMatchesDoubleTanhFormWithin1e6) {
  std::vector<float> xs;
  for (float x = -12.0f; x <= 12.0f; x += 0.00731f) xs.push_back(x);
  std::vector<float> got = xs;
  GeluNewInPlace(got.data(), static_cast<int64_t>(got.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const double want = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    ASSERT_NEAR(got[i], want, 1e-6 * (1 + std::abs(want))) << x;
  }
}

// Double-precision attention over contiguous K/V rows [pos + 1][head_dim].
std::vector<double> ReferenceAttention(const std::vector<float>& q,
                                       const std::vector<std::vector<float>>& k,
                                       const std::vector<std::vector<float>>& v, int pos) {
  const size_t hd = q.size();
  std::vector<double> s(pos + 1);
  for (int j = 0; j <= pos; ++j) {
    double d = 0;
    for (size_t i = 0; i < hd; ++i) d += double{q[i]} * k[j][i];
    s[j] = d / std::sqrt(static_cast<double>(hd));
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(hd, 0.0);
  for (int j = 0; j <= pos; ++j)
    for (size_t i = 0; i < hd; ++i) out[i] += s[j] / sum * v[j][i];
  return out;
}

TEST(OpsTest, PagedAttentionMatchesReferenceAndIgnoresBlockPlacement) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int hd : {4, 8, 64}) {
    for (int block_size : {1, 3, 16}) {
      const KvGeometry g{/*n_layer=*/2, /*n_head=*/3, hd, block_size};
      const int pos = 40;
      const int blocks_needed = pos / block_size + 1;
      const int num_blocks = blocks_needed * 2 + 3;
      std::vector<float> q(hd);
      for (float& x : q) x = dist(rng);
      std::vector<std::vector<float>> k(pos + 1, std::vector<float>(hd)),
          v(pos + 1, std::vector<float>(hd));
      for (auto* m : {&k, &v})
        for (auto& row : *m)
          for (float& x : row) x = dist(rng);
      std::vector<float> first_out;
      // Two different random, non-contiguous placements of the same rows; NaN everywhere
      // else (other blocks, other layers and heads, rows past `pos`).
      for (int placement = 0; placement < 2; ++placement) {
        std::vector<int32_t> ids(num_blocks);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(blocks_needed);
        std::vector<float> kv(num_blocks * g.block_stride(),
                              std::numeric_limits<float>::quiet_NaN());
        const int layer = 1, head = 2;
        for (int j = 0; j <= pos; ++j) {
          std::copy(k[j].begin(), k[j].end(),
                    kv.begin() + g.Offset(ids[j / block_size], layer, 0, head, j % block_size));
          std::copy(v[j].begin(), v[j].end(),
                    kv.begin() + g.Offset(ids[j / block_size], layer, 1, head, j % block_size));
        }
        std::vector<float> scratch(pos + 1 + 8), out(hd);
        AttendOne(q.data(), pos, kv.data(), g, ids.data(), layer, head, scratch.data(), out.data());
        const std::vector<double> want = ReferenceAttention(q, k, v, pos);
        for (int i = 0; i < hd; ++i) ASSERT_NEAR(out[i], want[i], 1e-5) << hd << " " << i;
        if (placement == 0) {
          first_out = out;
        } else {
          EXPECT_EQ(out, first_out);
        }
      }
    }
  }
}

TEST(OpsTest, AttendQueriesEqualsAttendOnePerQuery) {
  // The prefill path (many queries per key walk) against the decode path (one query), with
  // ==, for head sizes with and without a register-block specialisation, block sizes that do
  // and do not divide the positions, and query runs that start mid-block.
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int hd : {8, 12, 64}) {
    for (int block_size : {1, 5, 16}) {
      const KvGeometry g{/*n_layer=*/2, /*n_head=*/2, hd, block_size};
      const int max_pos = 70;
      const int num_blocks = max_pos / block_size + 1;
      std::vector<float> kv(num_blocks * g.block_stride());
      for (float& x : kv) x = dist(rng);
      std::vector<int32_t> table(num_blocks);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      for (int pos0 : {0, 3, 17, 40}) {
        for (int count : {1, 2, 7, 20, 30}) {
          if (pos0 + count > max_pos + 1) continue;
          std::vector<float> q(count * hd);
          for (float& x : q) x = dist(rng);
          std::vector<float> scratch(count * (pos0 + count + 8)), got(count * hd, -1.0f);
          AttendQueries(q.data(), hd, count, pos0, kv.data(), g, table.data(), 1, 1,
                        scratch.data(), got.data(), hd);
          for (int i = 0; i < count; ++i) {
            std::vector<float> one_scratch(pos0 + i + 1 + 8), want(hd);
            AttendOne(q.data() + i * hd, pos0 + i, kv.data(), g, table.data(), 1, 1,
                      one_scratch.data(), want.data());
            ASSERT_EQ(std::vector<float>(got.begin() + i * hd, got.begin() + (i + 1) * hd), want)
                << "hd=" << hd << " bs=" << block_size << " pos0=" << pos0 << " i=" << i;
          }
        }
      }
    }
  }
}

TEST(OpsTest, AttendChunksOfSeveralSequencesEqualsEachChunkAlone) {
  // Chunks of different sequences in one call (as the backend runs a step's decodes and
  // prefill chunks): block tables that share a prefix, diverge, or have nothing in common;
  // contexts of different lengths; one query or many. Each chunk's outputs must equal what
  // AttendQueries gives for it alone, with ==.
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int block_size : {4, 16}) {
    const int hd = 64;
    const KvGeometry g{/*n_layer=*/2, /*n_head=*/2, hd, block_size};
    const int num_blocks = 64;
    std::vector<float> kv(num_blocks * g.block_stride());
    for (float& x : kv) x = dist(rng);
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    // Tables: a shared prefix of 6 blocks (ids 0..5), then each its own blocks.
    auto table = [&](int own_from, int own_count) {
      std::vector<int32_t> t(ids.begin(), ids.begin() + 6);
      t.insert(t.end(), ids.begin() + own_from, ids.begin() + own_from + own_count);
      return t;
    };
    struct Spec {
      std::vector<int32_t> table;
      int pos0;
      int count;
    };
    const int bs = block_size;
    const std::vector<Spec> specs = {
        {table(10, 2), 6 * bs + 3, 1},          // decode past the shared prefix
        {table(12, 2), 6 * bs + 5, 1},          // another, different own blocks
        {table(14, 4), 6 * bs - 2, 9},          // prefill chunk crossing into its own blocks
        {table(20, 1), 2 * bs + 1, 1},          // a short context: only the first blocks
        {std::vector<int32_t>(ids.begin() + 30, ids.begin() + 40), 5, 3},  // nothing shared
    };
    std::vector<std::vector<float>> q(specs.size()), got(specs.size());
    std::vector<AttentionChunk> chunks;
    for (size_t c = 0; c < specs.size(); ++c) {
      q[c].resize(specs[c].count * hd);
      for (float& x : q[c]) x = dist(rng);
      got[c].assign(specs[c].count * hd, -1.0f);
      chunks.push_back({q[c].data(), hd, specs[c].count, specs[c].pos0, specs[c].table.data(),
                        got[c].data(), hd});
    }
    std::vector<float> scratch(AttendChunksScratch(chunks));
    AttendChunks(chunks, kv.data(), g, 1, 1, scratch.data());
    for (size_t c = 0; c < specs.size(); ++c) {
      const Spec& sp = specs[c];
      std::vector<float> alone_scratch(sp.count * (sp.pos0 + sp.count + 8));
      std::vector<float> want(sp.count * hd);
      AttendQueries(q[c].data(), hd, sp.count, sp.pos0, kv.data(), g, sp.table.data(), 1, 1,
                    alone_scratch.data(), want.data(), hd);
      EXPECT_EQ(got[c], want) << "bs=" << block_size << " chunk " << c;
    }
  }
}

}  // namespace
}  // namespace prefixd
