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
    std::vector<float> scratch(AttendChunksScratch(chunks, /*num_heads=*/1));
    AttendChunks(chunks, kv.data(), g, 1, 1, /*num_heads=*/1, scratch.data());
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

TEST(OpsTest, AttendBatchGivesEachHeadTheBitsOfAttendQueriesForAnySplit) {
  // Several heads per task (AttendChunks walks a block's heads as one run) against one head
  // at a time, with ==: every heads-per-task value, including ones that do not divide the
  // heads, 1 and 3 threads, decode chunks and a prefill chunk, some blocks shared.
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int hd = 16, n_head = 5, bs = 4;
  const KvGeometry g{/*n_layer=*/2, n_head, hd, bs};
  const int64_t e = int64_t{n_head} * hd;
  const int num_blocks = 40;
  std::vector<float> kv(num_blocks * g.block_stride());
  for (float& x : kv) x = dist(rng);
  const std::vector<std::vector<int32_t>> tables = {
      {3, 7, 1, 9, 12}, {3, 7, 2, 20}, {30, 31, 32, 33, 34, 35}, {3, 8}};
  struct Spec {
    int table, pos0, count;
  };
  const std::vector<Spec> specs = {{0, 17, 1}, {1, 13, 1}, {2, 9, 12}, {3, 5, 1}};
  // Rows laid out as the backend's: [q | k | v] for every head, outputs [head 0 | head 1 ..].
  std::vector<std::vector<float>> qkv(specs.size());
  for (size_t c = 0; c < specs.size(); ++c) {
    qkv[c].resize(specs[c].count * 3 * e);
    for (float& x : qkv[c]) x = dist(rng);
  }
  auto chunks_into = [&](std::vector<std::vector<float>>& out) {
    std::vector<AttentionChunk> chunks;
    out.assign(specs.size(), {});
    for (size_t c = 0; c < specs.size(); ++c) {
      out[c].assign(specs[c].count * e, -1.0f);
      chunks.push_back({qkv[c].data(), 3 * e, specs[c].count, specs[c].pos0,
                        tables[specs[c].table].data(), out[c].data(), e});
    }
    return chunks;
  };
  std::vector<std::vector<float>> want;
  chunks_into(want);
  for (size_t c = 0; c < specs.size(); ++c) {
    for (int head = 0; head < n_head; ++head) {
      std::vector<float> scratch(specs[c].count * (specs[c].pos0 + specs[c].count + 8));
      AttendQueries(qkv[c].data() + head * hd, 3 * e, specs[c].count, specs[c].pos0, kv.data(), g,
                    tables[specs[c].table].data(), 1, head, scratch.data(),
                    want[c].data() + head * hd, e);
    }
  }
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (int heads_per_task = 1; heads_per_task <= n_head + 1; ++heads_per_task) {
      std::vector<std::vector<float>> got;
      const std::vector<AttentionChunk> chunks = chunks_into(got);
      AttendBatch(chunks, kv.data(), g, 1, heads_per_task, &pool);
      EXPECT_EQ(got, want) << threads << " threads, " << heads_per_task << " heads per task";
    }
  }
}

TEST(OpsTest, AttentionHeadsPerTaskKeepsSharedBlocksInOneTaskAndEveryThreadBusy) {
  // Sequences of their own: enough tasks for the pool (4 per thread where the heads and
  // chunks allow), as many heads per task as that leaves. Chunks that share their first
  // block: one head per task, all chunks in it.
  const std::vector<std::vector<int32_t>> own = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
  auto chunks = [](const std::vector<std::vector<int32_t>>& tables, size_t n) {
    std::vector<AttentionChunk> c(n);
    for (size_t i = 0; i < n; ++i) c[i].block_table = tables[i].data();
    return c;
  };
  EXPECT_EQ(AttentionHeadsPerTask(12, chunks(own, 8), 2), 12);  // one chunk per task
  EXPECT_EQ(AttentionHeadsPerTask(12, chunks(own, 4), 2), 6);
  EXPECT_EQ(AttentionHeadsPerTask(12, chunks(own, 1), 2), 2);   // 6 tasks of 2 heads
  EXPECT_EQ(AttentionHeadsPerTask(12, chunks(own, 1), 16), 1);  // more threads than heads
  std::vector<std::vector<int32_t>> shared = own;
  shared[5] = {2, 9};  // sequence 5 starts on sequence 2's block
  EXPECT_EQ(AttentionHeadsPerTask(12, chunks(shared, 8), 2), 1);
  EXPECT_EQ(AttentionHeadsPerTask(12, chunks(shared, 5), 2), 6);  // not among these 5
}

}  // namespace
}  // namespace prefixd
