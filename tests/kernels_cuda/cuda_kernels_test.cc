// Each CUDA kernel against an obviously-right CPU twin, per dtype, over several shapes.
// Tolerance: KernelTolerance(dtype) (cuda_test_util.h) unless a test states otherwise.
// Skipped where no CUDA device is usable.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/block_copy.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/kv_pool_layout.h"
#include "kernels/cuda/kv_write.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "tests/kernels_cuda/cuda_test_util.h"

namespace prefixd {
namespace {

using cuda_test::Decode;
using cuda_test::DeviceBuffer;
using cuda_test::Encode;
using cuda_test::ExpectClose;
using cuda_test::KernelTolerance;
using cuda_test::RandomVector;
using cuda_test::Round;

class CudaKernelTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { PREFIXD_SKIP_WITHOUT_CUDA(); }
  DType dt() const { return GetParam(); }
  std::mt19937 rng_{1234};
};

TEST_P(CudaKernelTest, EmbeddingAddsTokenAndPositionRows) {
  for (auto [vocab, positions, n_embd, tokens] : std::vector<std::tuple<int, int, int, int>>{
           {50, 16, 8, 1}, {300, 64, 768, 33}, {97, 40, 1000, 40}}) {
    const std::vector<float> wte = Round(RandomVector(vocab * n_embd, &rng_), dt());
    const std::vector<float> wpe = Round(RandomVector(positions * n_embd, &rng_), dt());
    std::vector<int32_t> ids(tokens), pos(tokens);
    for (int t = 0; t < tokens; ++t) {
      ids[t] = static_cast<int32_t>(rng_() % vocab);
      pos[t] = static_cast<int32_t>(rng_() % positions);
    }
    DeviceBuffer d_wte(Encode(wte, dt())), d_wpe(Encode(wpe, dt())), d_ids(ids), d_pos(pos);
    DeviceBuffer d_x(tokens * n_embd * sizeof(float));
    ASSERT_TRUE(d_wte.ok() && d_wpe.ok() && d_ids.ok() && d_pos.ok() && d_x.ok());
    PREFIXD_ASSERT_CUDA(cuda::LaunchEmbedding(dt(), d_wte.get(), d_wpe.get(), d_ids.get<int32_t>(),
                                              d_pos.get<int32_t>(), tokens, n_embd,
                                              d_x.get<float>(), nullptr));
    std::vector<float> ref(tokens * n_embd);
    for (int t = 0; t < tokens; ++t) {
      for (int e = 0; e < n_embd; ++e) {
        ref[t * n_embd + e] = wte[ids[t] * n_embd + e] + wpe[pos[t] * n_embd + e];
      }
    }
    // Exact: one fp32 addition of the same two values.
    ExpectClose(d_x.Download<float>(), ref, {0, 0}, "embedding E=" + std::to_string(n_embd));
  }
}

TEST_P(CudaKernelTest, LayerNormWithResidualBiasAndGather) {
  for (auto [rows_x, n_embd, with_bias, gather] :
       std::vector<std::tuple<int, int, bool, bool>>{{1, 16, false, false},
                                                     {5, 768, true, false},
                                                     {64, 1000, true, true},
                                                     {9, 64, false, true}}) {
    // An offset mean (residual streams have |mean| >> std) to exercise the two-pass variance.
    std::vector<float> x = RandomVector(rows_x * n_embd, &rng_, 5.0f, 7.0f);
    const std::vector<float> bias = Round(RandomVector(n_embd, &rng_), dt());
    const std::vector<float> gamma = Round(RandomVector(n_embd, &rng_, 0.5f, 1.5f), dt());
    const std::vector<float> beta = Round(RandomVector(n_embd, &rng_), dt());
    std::vector<int32_t> index(rows_x);
    std::iota(index.begin(), index.end(), 0);
    std::shuffle(index.begin(), index.end(), rng_);
    const int rows = gather ? std::max(1, rows_x / 2) : rows_x;
    index.resize(rows);
    DeviceBuffer d_x(x), d_bias(Encode(bias, dt())), d_gamma(Encode(gamma, dt()));
    DeviceBuffer d_beta(Encode(beta, dt())), d_index(index);
    DeviceBuffer d_out(rows * n_embd * DTypeSize(dt()));
    ASSERT_TRUE(d_x.ok() && d_bias.ok() && d_gamma.ok() && d_beta.ok() && d_index.ok() &&
                d_out.ok());
    cuda::LayerNormArgs a;
    a.x = d_x.get<float>();
    a.row_index = gather ? d_index.get<int32_t>() : nullptr;
    a.residual_bias = with_bias ? d_bias.get() : nullptr;
    a.gamma = d_gamma.get();
    a.beta = d_beta.get();
    a.out = d_out.get();
    a.num_rows = rows;
    a.n_embd = n_embd;
    a.eps = 1e-5f;
    PREFIXD_ASSERT_CUDA(cuda::LaunchLayerNorm(dt(), a, nullptr));

    std::vector<float> ref(rows * n_embd), ref_x = x;
    for (int r = 0; r < rows; ++r) {
      const int i = gather ? index[r] : r;
      float* row = &ref_x[i * n_embd];
      if (with_bias) {
        for (int e = 0; e < n_embd; ++e) row[e] += bias[e];
      }
      double mean = 0, var = 0;
      for (int e = 0; e < n_embd; ++e) mean += row[e];
      mean /= n_embd;
      for (int e = 0; e < n_embd; ++e) var += (row[e] - mean) * (row[e] - mean);
      var /= n_embd;
      for (int e = 0; e < n_embd; ++e) {
        ref[r * n_embd + e] =
            static_cast<float>((row[e] - mean) / std::sqrt(var + 1e-5) * gamma[e] + beta[e]);
      }
    }
    const std::string what = "layernorm E=" + std::to_string(n_embd);
    ExpectClose(Decode(d_out.Download<uint8_t>(), dt()), ref, KernelTolerance(dt()), what);
    // Rows that were normalised carry the bias now; the others are untouched (exact).
    ExpectClose(d_x.Download<float>(), ref_x, {0, 0}, what + " residual");
  }
}

TEST_P(CudaKernelTest, BiasGeluMatchesGeluNew) {
  for (auto [rows, width] : std::vector<std::pair<int, int>>{{1, 64}, {3, 3072}, {1100, 1000}}) {
    const std::vector<float> fc = RandomVector(rows * width, &rng_, -6.0f, 6.0f);
    const std::vector<float> bias = Round(RandomVector(width, &rng_), dt());
    DeviceBuffer d_fc(fc), d_bias(Encode(bias, dt())), d_out(rows * width * DTypeSize(dt()));
    ASSERT_TRUE(d_fc.ok() && d_bias.ok() && d_out.ok());
    PREFIXD_ASSERT_CUDA(cuda::LaunchBiasGelu(dt(), d_fc.get<float>(), d_bias.get(), rows, width,
                                             d_out.get(), nullptr));
    std::vector<float> ref(rows * width);
    for (int i = 0; i < rows * width; ++i) {
      const double x = fc[i] + bias[i % width];
      ref[i] = static_cast<float>(
          0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))));
    }
    ExpectClose(Decode(d_out.Download<uint8_t>(), dt()), ref, KernelTolerance(dt()),
                "gelu width=" + std::to_string(width));
  }
}

// A pool filled with NaN: every row a kernel is not meant to touch stays NaN.
std::vector<float> NanPool(const cuda::KvPoolLayout& layout, int64_t num_blocks) {
  return std::vector<float>(layout.block_elems() * num_blocks, std::nanf(""));
}

TEST_P(CudaKernelTest, KvWriteAddsBiasAndScattersRowsToSlots) {
  for (auto [n_layer, n_head, head_dim, block_size, tokens] :
       std::vector<std::tuple<int, int, int, int, int>>{
           {1, 1, 8, 4, 1}, {2, 2, 32, 16, 21}, {3, 12, 64, 16, 40}}) {
    const cuda::KvPoolLayout layout{n_layer, n_head, block_size, head_dim};
    const int num_blocks = (tokens + block_size - 1) / block_size + 3;
    const int n_embd = n_head * head_dim;
    const int layer = n_layer - 1;
    // Distinct random slots across the pool.
    std::vector<int32_t> all(num_blocks * block_size);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    const std::vector<int32_t> slots(all.begin(), all.begin() + tokens);
    const std::vector<float> qkv = RandomVector(tokens * 3 * n_embd, &rng_);
    const std::vector<float> bias = Round(RandomVector(3 * n_embd, &rng_), dt());
    std::vector<float> pool = NanPool(layout, num_blocks);
    DeviceBuffer d_qkv(qkv), d_bias(Encode(bias, dt())), d_slots(slots);
    DeviceBuffer d_pool(Encode(pool, dt()));
    ASSERT_TRUE(d_qkv.ok() && d_bias.ok() && d_slots.ok() && d_pool.ok());
    cuda::KvWriteArgs a;
    a.qkv = d_qkv.get<float>();
    a.bias = d_bias.get();
    a.slots = d_slots.get<int32_t>();
    a.kv_pool = d_pool.get();
    a.layout = layout;
    a.layer = layer;
    a.num_tokens = tokens;
    PREFIXD_ASSERT_CUDA(cuda::LaunchKvWrite(dt(), a, nullptr));

    std::vector<float> ref_qkv = qkv;
    for (int t = 0; t < tokens; ++t) {
      for (int e = 0; e < 3 * n_embd; ++e) ref_qkv[t * 3 * n_embd + e] += bias[e];
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < n_head; ++h) {
          for (int d = 0; d < head_dim; ++d) {
            pool[layout.HeadOffset(slots[t] / block_size, layer, kv, h) +
                 (slots[t] % block_size) * head_dim + d] =
                ref_qkv[t * 3 * n_embd + (kv + 1) * n_embd + h * head_dim + d];
          }
        }
      }
    }
    ExpectClose(d_qkv.Download<float>(), ref_qkv, {0, 0}, "qkv + bias");
    const std::vector<float> got = Decode(d_pool.Download<uint8_t>(), dt());
    const std::vector<float> want = Round(pool, dt());
    size_t wrong = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i];
      wrong += same ? 0 : 1;
    }
    EXPECT_EQ(wrong, 0u) << "pool elements differing (NaN = untouched) for head_dim " << head_dim;
  }
}

TEST_P(CudaKernelTest, BlockCopyCopiesRowsOfEveryLayerAndHead) {
  const cuda::KvPoolLayout layout{3, 4, 16, 24};
  const int num_blocks = 10;
  // A known pattern: each element's value encodes its index (exact in bf16 up to 256, so
  // modulo 251 keeps it exact in every dtype).
  std::vector<float> pool(layout.block_elems() * num_blocks);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<float>(i % 251);
  DeviceBuffer d_pool(Encode(pool, dt()));
  // Full block, partial block, zero rows; destinations fresh, as cache/ does.
  const std::vector<int32_t> copies = {2, 7, 16, 5, 1, 9, 3, 8, 0};
  DeviceBuffer d_copies(copies);
  ASSERT_TRUE(d_pool.ok() && d_copies.ok());
  PREFIXD_ASSERT_CUDA(
      cuda::LaunchBlockCopy(dt(), d_copies.get<int32_t>(), 3, layout, d_pool.get(), nullptr));
  std::vector<float> want = pool;
  for (size_t c = 0; c < copies.size(); c += 3) {
    for (int l = 0; l < layout.n_layer; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < layout.n_head; ++h) {
          for (int e = 0; e < copies[c + 2] * layout.head_dim; ++e) {
            want[layout.HeadOffset(copies[c + 1], l, kv, h) + e] =
                pool[layout.HeadOffset(copies[c], l, kv, h) + e];
          }
        }
      }
    }
  }
  ExpectClose(Decode(d_pool.Download<uint8_t>(), dt()), want, {0, 0}, "block copy");
}

// softmax(q k^T / sqrt(head_dim)) v in double over keys [0, position], read through the
// block table: the obviously-right twin of the paged attention kernel.
std::vector<float> AttentionReference(int n_head, int head_dim, int block_size,
                                      const cuda::KvPoolLayout& layout, int layer,
                                      const std::vector<float>& qkv, const std::vector<float>& pool,
                                      const std::vector<int32_t>& positions,
                                      const std::vector<int32_t>& token_seq,
                                      const std::vector<int32_t>& tables, int max_blocks) {
  const int n_embd = n_head * head_dim;
  const int tokens = static_cast<int>(positions.size());
  std::vector<float> ref(tokens * n_embd);
  for (int t = 0; t < tokens; ++t) {
    const int32_t* table = &tables[token_seq[t] * max_blocks];
    for (int h = 0; h < n_head; ++h) {
      const float* q = &qkv[t * 3 * n_embd + h * head_dim];
      std::vector<double> score(positions[t] + 1);
      double max_score = -INFINITY;
      for (int j = 0; j <= positions[t]; ++j) {
        const float* k = &pool[layout.HeadOffset(table[j / block_size], layer, 0, h) +
                               (j % block_size) * head_dim];
        double dot = 0;
        for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        score[j] = dot / std::sqrt(static_cast<double>(head_dim));
        max_score = std::max(max_score, score[j]);
      }
      double sum = 0;
      for (double& sc : score) sum += (sc = std::exp(sc - max_score));
      for (int d = 0; d < head_dim; ++d) {
        double o = 0;
        for (int j = 0; j <= positions[t]; ++j) {
          o += score[j] * pool[layout.HeadOffset(table[j / block_size], layer, 1, h) +
                               (j % block_size) * head_dim + d];
        }
        ref[t * n_embd + h * head_dim + d] = static_cast<float>(o / sum);
      }
    }
  }
  return ref;
}

// Paged attention: random, non-contiguous block tables; NaN in every slot past each
// sequence's end (rest of its last block, and every block nobody owns). Query tokens are a
// chunk ending at the sequence's last position: chunk 1 is decode, chunk = length is a
// one-shot prefill, anything between a chunked prefill with the offset causal mask.
TEST_P(CudaKernelTest, PagedAttentionMatchesSoftmaxReference) {
  struct Case {
    int n_head, head_dim, block_size;
    std::vector<std::pair<int, int>> seqs;  // (length, query chunk)
  };
  const std::vector<Case> cases = {
      {1, 16, 4, {{1, 1}}},
      {2, 64, 16, {{37, 1}, {16, 16}, {50, 7}, {1, 1}}},
      {3, 80, 7, {{100, 100}, {29, 1}, {64, 3}}},
      {12, 64, 16, {{1000, 1}, {130, 2}}},
      {2, 128, 16, {{300, 5}}},
  };
  for (const Case& c : cases) {
    const int n_embd = c.n_head * c.head_dim;
    const int n_layer = 2, layer = 1;
    const cuda::KvPoolLayout layout{n_layer, c.n_head, c.block_size, c.head_dim};
    int needed = 0, max_blocks = 0;
    for (auto [len, chunk] : c.seqs) {
      const int b = (len + c.block_size - 1) / c.block_size;
      needed += b;
      max_blocks = std::max(max_blocks, b);
    }
    const int num_blocks = needed + 5;
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    std::vector<float> pool = NanPool(layout, num_blocks);
    std::vector<int32_t> tables(c.seqs.size() * max_blocks, -1), positions, token_seq;
    int next = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const auto [len, chunk] = c.seqs[s];
      for (int b = 0; b * c.block_size < len; ++b) tables[s * max_blocks + b] = ids[next++];
      for (int p = 0; p < len; ++p) {
        const int block = tables[s * max_blocks + p / c.block_size];
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < c.n_head; ++h) {
            for (int d = 0; d < c.head_dim; ++d) {
              // Keys spread enough that the softmax is far from uniform.
              pool[layout.HeadOffset(block, layer, kv, h) + (p % c.block_size) * c.head_dim + d] =
                  std::uniform_real_distribution<float>(-2, 2)(rng_);
            }
          }
        }
      }
      for (int p = len - chunk; p < len; ++p) {
        positions.push_back(p);
        token_seq.push_back(static_cast<int32_t>(s));
      }
    }
    // Unused table entries point at a NaN block too: a read past the end would show.
    for (int32_t& e : tables) {
      if (e < 0) e = ids.back();
    }
    const int tokens = static_cast<int>(positions.size());
    const std::vector<float> qkv = RandomVector(tokens * 3 * n_embd, &rng_, -2, 2);
    pool = Round(pool, dt());
    DeviceBuffer d_qkv(qkv), d_pool(Encode(pool, dt())), d_pos(positions), d_seq(token_seq);
    DeviceBuffer d_tables(tables);
    ASSERT_TRUE(d_qkv.ok() && d_pool.ok() && d_pos.ok() && d_seq.ok() && d_tables.ok());
    std::vector<float> ref =
        AttentionReference(c.n_head, c.head_dim, c.block_size, layout, layer, qkv, pool, positions,
                           token_seq, tables, max_blocks);
    // Unsplit, split in parts of uneven sizes, and the most splits (parts of one key or
    // none for short sequences).
    for (int splits : {1, 3, cuda::kMaxAttentionSplits}) {
      DeviceBuffer d_out(tokens * n_embd * DTypeSize(dt()));
      DeviceBuffer d_partials(cuda::AttentionPartialFloats(tokens, c.n_head, c.head_dim, splits) *
                              sizeof(float));
      ASSERT_TRUE(d_out.ok() && d_partials.ok());
      cuda::AttentionArgs a;
      a.qkv = d_qkv.get<float>();
      a.kv_pool = d_pool.get();
      a.layout = layout;
      a.layer = layer;
      a.positions = d_pos.get<int32_t>();
      a.token_seq = d_seq.get<int32_t>();
      a.block_tables = d_tables.get<int32_t>();
      a.max_blocks_per_seq = max_blocks;
      a.num_tokens = tokens;
      a.num_splits = splits;
      a.partials = splits > 1 ? d_partials.get<float>() : nullptr;
      a.out = d_out.get();
      PREFIXD_ASSERT_CUDA(cuda::LaunchPagedAttention(dt(), a, nullptr));
      // fp32 exp/rsqrt and online rescaling over up to 1000 keys: 2e-5 absolute on outputs of
      // magnitude ~1 is a few hundred ulps; the f16/bf16 rule is the output rounding.
      cuda_test::Tolerance tol = KernelTolerance(dt());
      if (dt() == DType::kF32) tol = {2e-5, 2e-5};
      ExpectClose(Decode(d_out.Download<uint8_t>(), dt()), ref, tol,
                  "attention head_dim=" + std::to_string(c.head_dim) + " block_size=" +
                      std::to_string(c.block_size) + " splits=" + std::to_string(splits));
    }
  }
}

// Host-side: how keys are split (no device needed).
TEST(AttentionSplitsTest, SplitsOnlySmallBatchesWithLongContexts) {
  // GPT-2 small on an H200 (132 SMs): target 528 blocks.
  EXPECT_EQ(cuda::AttentionSplits(1, 12, 1001, 132), 8);  // 64 x 8 <= 1001 < 64 x 16
  EXPECT_EQ(cuda::AttentionSplits(1, 12, 1024, 132), 16);
  EXPECT_EQ(cuda::AttentionSplits(8, 12, 1001, 132), 8);   // 96 blocks -> 768
  EXPECT_EQ(cuda::AttentionSplits(64, 12, 1001, 132), 1);  // 768 blocks already
  EXPECT_EQ(cuda::AttentionSplits(1, 12, 129, 132), 2);    // parts of >= 64 keys
  EXPECT_EQ(cuda::AttentionSplits(1, 12, 127, 132), 1);
  EXPECT_EQ(cuda::AttentionSplits(4096, 12, 1024, 132), 1);  // prefill
  for (int tokens : {1, 2, 3, 8, 33, 256}) {
    const int s = cuda::AttentionSplits(tokens, 12, 1024, 132);
    if (s > 1) {
      EXPECT_LE(int64_t{tokens} * 12 * s, 8 * 132) << "the backend's partials bound";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CudaKernelTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         cuda_test::DTypeParamName);

}  // namespace
}  // namespace prefixd
