// The CPU backend end to end on tiny random models: exactness against the double reference,
// bit-exact invariance (chunking, caching, batch composition, copy-on-write, threads),
// block copies by pattern, and argument errors.
#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_layout.h"
#include "cache/sha256.h"
#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "tests/kernels/kv_pool_access.h"
#include "tests/kernels/reference_gpt2.h"
#include "tests/kernels/test_models.h"

namespace prefixd {
namespace {

using testing::Blocks;
using testing::MakeBackend;
using testing::Prefill;
using testing::RandomTokens;

// On a CPU with AVX-512 VNNI but no AMX, kAmx runs the tile instructions in scalar code for
// the whole binary: PREFIXD_CPU_ISA=amx (the "amx." run of this suite, tests/kernels/
// CMakeLists.txt) then takes every test through the AMX blocks, here emulated; on an AMX host,
// through the tiles themselves.
class AmxEmulation : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!MatMulIsaSupported(MatMulIsa::kAmx)) SetAmxEmulationForTesting(true);
  }
};
::testing::Environment* const amx_emulation =
    ::testing::AddGlobalTestEnvironment(new AmxEmulation);

TEST(CpuIsaTest, PrefixdCpuIsaChoosesTheBlocksThatRun) {
  // The suite's "avx2_only." and "amx." runs: the variable reaches MatMul's automatic choice
  // (so those runs test what they are named for).
  const char* env = std::getenv("PREFIXD_CPU_ISA");
  const std::string want = env == nullptr ? "" : env;
  if (want == "avx2") {
    EXPECT_EQ(MatMulIsaInUse(), "avx2");
  } else if (want == "amx" && MatMulIsaSupported(MatMulIsa::kAmx)) {
    EXPECT_EQ(MatMulIsaInUse().substr(0, 3), "amx") << MatMulIsaInUse();
  } else {
    GTEST_SKIP() << "PREFIXD_CPU_ISA is not avx2, or amx with AMX (or emulated tiles) here";
  }
}

class CpuBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = testing::WriteAndLoad(TinyModelConfig(), 11, "tiny").release();
    odd_ = testing::WriteAndLoad(testing::OddModelConfig(), 12, "odd").release();
  }
  static void TearDownTestSuite() {
    delete tiny_;
    delete odd_;
  }
  static std::vector<const Model*> Models() { return {tiny_, odd_}; }

  static inline Model* tiny_ = nullptr;
  static inline Model* odd_ = nullptr;
};

// The invariance tests, once per weight dtype: half-precision and int8 backends keep every one.
class CpuBackendDTypeTest : public CpuBackendTest, public ::testing::WithParamInterface<DType> {};

INSTANTIATE_TEST_SUITE_P(AllDTypes, CpuBackendDTypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kI8),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

void ExpectNearReference(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  double max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
  const double scale = MaxAbs(want);
  EXPECT_GT(scale, 0.1);  // the random model's logits are O(1), not all ~0
  EXPECT_LE(max_diff, 1e-4 * scale) << "max |ref| " << scale;
}

TEST_F(CpuBackendTest, PrefillAndDecodeMatchDoubleReference) {
  for (const Model* model : Models()) {
    ASSERT_NE(model, nullptr);
    testing::ReferenceGpt2 ref(*model);
    auto backend = MakeBackend(*model, 2);
    std::vector<uint32_t> tokens = RandomTokens(21, 1);
    const std::vector<int32_t> table = {5, 2, 9};  // non-contiguous, out of order
    std::vector<float> logits = Prefill(*backend, tokens, table, 0);
    ExpectNearReference(logits, ref.LastLogits(tokens));
    // Greedy decode a few steps, each checked against a from-scratch reference.
    for (int step = 0; step < 4; ++step) {
      const uint32_t next =
          static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      tokens.push_back(next);
      SequenceStep s;
      s.token_ids = absl::MakeConstSpan(tokens).subspan(tokens.size() - 1);
      s.start_pos = static_cast<int32_t>(tokens.size()) - 1;
      s.block_table = table;
      s.want_logits = true;
      logits.clear();
      ASSERT_TRUE(backend->Forward({s}, &logits).ok());
      ExpectNearReference(logits, ref.LastLogits(tokens));
    }
  }
}

TEST_P(CpuBackendDTypeTest, ChunkSizeDoesNotChangeLogits) {
  for (const Model* model : Models()) {
    auto backend = MakeBackend(*model, 2, 64, 16, GetParam());
    const std::vector<uint32_t> tokens = RandomTokens(37, 2);
    const std::vector<float> all = Prefill(*backend, tokens, Blocks(0, 3), 0);
    for (int chunk : {1, 3, 16}) {
      EXPECT_EQ(Prefill(*backend, tokens, Blocks(10 + chunk, 3), chunk), all) << chunk;
    }
  }
}

TEST_P(CpuBackendDTypeTest, CachedPrefixGivesSameLogitsAsRecompute) {
  for (const Model* model : Models()) {
    auto backend = MakeBackend(*model, 2, 64, 16, GetParam());
    const std::vector<uint32_t> prompt = RandomTokens(45, 3);
    const std::vector<float> recomputed = Prefill(*backend, prompt, Blocks(0, 3), 0);
    // A second sequence shares the first two full blocks (32 tokens) and computes the rest
    // into its own block.
    const std::vector<int32_t> shared = {0, 1, 7};
    EXPECT_EQ(Prefill(*backend, prompt, shared, 0, /*from=*/32), recomputed);
    // And one that resumes mid-block after its cached rows were copied (copy-on-write of the
    // first 5 rows of block 1 into block 8).
    ASSERT_TRUE(backend->CopyBlocks({BlockCopy{1, 8, 5}}).ok());
    EXPECT_EQ(Prefill(*backend, prompt, {0, 8, 9}, 3, /*from=*/21), recomputed);
  }
}

// The disk tier's path: blocks read to host bytes and written into other blocks (another
// backend's pool, as after a restart) serve bit-identical logits.
TEST_F(CpuBackendTest, KvBlocksRoundTripThroughHostBytes) {
  for (const Model* model : Models()) {
    auto backend = MakeBackend(*model, 2);
    auto restarted = MakeBackend(*model, 2);
    const std::vector<uint32_t> prompt = RandomTokens(45, 5);
    const std::vector<float> recomputed = Prefill(*backend, prompt, Blocks(0, 3), 0);
    const size_t bytes = static_cast<size_t>(backend->KvBlockBytes());
    ASSERT_EQ(bytes, backend->kv_bytes_per_token() * backend->block_size());
    for (int32_t b = 0; b < 2; ++b) {
      std::vector<uint8_t> host(bytes), back(bytes);
      ASSERT_TRUE(backend->ReadKvBlock(b, absl::MakeSpan(host)).ok());
      ASSERT_TRUE(restarted->WriteKvBlock(5 + b, host).ok());
      ASSERT_TRUE(restarted->ReadKvBlock(5 + b, absl::MakeSpan(back)).ok());
      EXPECT_EQ(back, host);
    }
    EXPECT_EQ(Prefill(*restarted, prompt, {5, 6, 2}, 0, /*from=*/32), recomputed);
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(backend->ReadKvBlock(-1, absl::MakeSpan(host)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend->WriteKvBlock(static_cast<int32_t>(backend->num_blocks()), host).code(),
              absl::StatusCode::kInvalidArgument);
    host.pop_back();
    EXPECT_EQ(backend->WriteKvBlock(0, host).code(), absl::StatusCode::kInvalidArgument);
  }
}

// The K/V bits the CPU kernels computed when kCpuKvNumerics was last named. A disk tier only
// reuses blocks whose numerics string is equal, so a change that moves any of these bits must
// rename kCpuKvNumerics (kernels/cpu/cpu_backend.h) and then record the new digests here;
// the invariance tests make them the same on every instruction set and thread count.
TEST_F(CpuBackendTest, KvBitsAreTheOnesItsNumericsNameRecords) {
  ASSERT_EQ(kCpuKvNumerics, "cpu r1");
  struct Pinned {
    const Model* model;
    DType dtype;
    const char* sha256;
  };
  const Pinned pinned[] = {
      {tiny_, DType::kF32, "dad3ed78ea3ad9d011aa9a6d14e46112d4ce6f12b58ac48721df6f4064f0c3e5"},
      {tiny_, DType::kF16, "8e5420eb7c028f82cc165a43916acb309440239bed33798711748198a4a6899b"},
      {tiny_, DType::kBF16, "5b3e4f9fc931e89cb207ca3e1a256f8558047f866ff02ff14214c903667ae49b"},
      {odd_, DType::kF32, "d470f3a09d8c7c9d01344dfe27ce9dfa687136790704178fe71e6504c064b39a"},
      {tiny_, DType::kI8, "3416cce44e9eab34f0b295dafe02872cc6fd24473e8030ac932d50043f057578"},
      {odd_, DType::kI8, "0d92c83eda9e79826deab5383041dd99cefe72a815b6e4e581e76c095e17c5a0"},
  };
  for (const Pinned& p : pinned) {
    SCOPED_TRACE(
        absl::StrCat(p.model == tiny_ ? "tiny " : "odd ", std::string(DTypeName(p.dtype))));
    auto backend = MakeBackend(*p.model, 2, 64, 16, p.dtype);
    const std::vector<uint32_t> prompt = RandomTokens(48, 31);
    Prefill(*backend, prompt, Blocks(0, 3), 0);
    std::string bytes;
    for (int32_t b = 0; b < 3; ++b) {
      std::vector<uint8_t> host(static_cast<size_t>(backend->KvBlockBytes()));
      ASSERT_TRUE(backend->ReadKvBlock(b, absl::MakeSpan(host)).ok());
      bytes.append(reinterpret_cast<const char*>(host.data()), host.size());
    }
    EXPECT_EQ(DigestHex(Sha256Of(bytes)), p.sha256)
        << "the CPU kernels' K/V bits changed: rename kCpuKvNumerics and record the new digest";
  }
}

TEST_P(CpuBackendDTypeTest, BatchCompanionsDoNotChangeLogits) {
  const Model& model = *tiny_;
  auto backend = MakeBackend(model, 2, 64, 16, GetParam());
  const std::vector<uint32_t> a = RandomTokens(20, 4), b = RandomTokens(33, 5),
                              c = RandomTokens(7, 6);
  // Alone: a's prompt, then a decode token.
  const std::vector<float> a_alone = Prefill(*backend, a, Blocks(0, 2), 0);
  std::vector<uint32_t> a2 = a;
  a2.push_back(17);
  const std::vector<float> a2_alone = Prefill(*backend, a2, Blocks(0, 2), 0, /*from=*/20);

  // Batched: b's prefill chunk before, c's after, then a's decode next to b's decode.
  const std::vector<int32_t> ta = Blocks(10, 2), tb = Blocks(20, 3), tc = Blocks(30, 1);
  std::vector<SequenceStep> steps(3);
  steps[0] = {absl::MakeConstSpan(b).subspan(0, 30), 0, tb, true};
  steps[1] = {a, 0, ta, true};
  steps[2] = {c, 0, tc, false};
  std::vector<float> logits;
  ASSERT_TRUE(backend->Forward(steps, &logits).ok());
  const size_t v = model.config().vocab_size;
  ASSERT_EQ(logits.size(), 2 * v);
  EXPECT_EQ(std::vector<float>(logits.begin() + v, logits.end()), a_alone);

  steps.resize(2);
  steps[0] = {absl::MakeConstSpan(b).subspan(30, 3), 30, tb, true};
  steps[1] = {absl::MakeConstSpan(a2).subspan(20, 1), 20, ta, true};
  logits.clear();
  ASSERT_TRUE(backend->Forward(steps, &logits).ok());
  EXPECT_EQ(std::vector<float>(logits.begin() + v, logits.end()), a2_alone);
  // b too equals b alone.
  EXPECT_EQ(std::vector<float>(logits.begin(), logits.begin() + v),
            Prefill(*backend, b, Blocks(40, 3), 0));
}

TEST_P(CpuBackendDTypeTest, ThreadCountDoesNotChangeLogits) {
  for (const Model* model : Models()) {
    const std::vector<uint32_t> tokens = RandomTokens(30, 7);
    auto one = MakeBackend(*model, 1, 64, 16, GetParam());
    auto two = MakeBackend(*model, 2, 64, 16, GetParam());
    auto three = MakeBackend(*model, 3, 64, 16, GetParam());
    const std::vector<float> want = Prefill(*one, tokens, Blocks(0, 2), 0);
    EXPECT_EQ(Prefill(*two, tokens, Blocks(0, 2), 0), want);
    EXPECT_EQ(Prefill(*three, tokens, Blocks(0, 2), 7), want);
  }
}

TEST_P(CpuBackendDTypeTest, InstructionSetDoesNotChangeLogits) {
  // The AVX2 and AVX-512 matrix-product blocks end to end (prefill in one go and in chunks of
  // 5, which decodes through the small-row kernels): the same bits.
  if (!MatMulIsaSupported(MatMulIsa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const Model* model : Models()) {
    const std::vector<uint32_t> tokens = RandomTokens(40, 9);
    auto backend = MakeBackend(*model, 2, 64, 16, GetParam());
    SetMatMulIsa(MatMulIsa::kAvx2);
    const std::vector<float> want = Prefill(*backend, tokens, Blocks(0, 3), 0);
    const std::vector<float> want_chunked = Prefill(*backend, tokens, Blocks(3, 3), 5);
    SetMatMulIsa(MatMulIsa::kAvx512);
    const std::vector<float> got = Prefill(*backend, tokens, Blocks(6, 3), 0);
    const std::vector<float> got_chunked = Prefill(*backend, tokens, Blocks(9, 3), 5);
    SetMatMulIsa(MatMulIsa::kAuto);
    EXPECT_EQ(got, want);
    EXPECT_EQ(got_chunked, want_chunked);
    EXPECT_EQ(got_chunked, want);
    // int8's other sets of blocks: AVX-VNNI (chunks of 5 decode through its few-row tiles),
    // AMX (16-row tiles with VNNI tails: chunks of 17).
    struct Other {
      MatMulIsa isa;
      int32_t first_block;
      int chunk;
    };
    for (const Other& o : {Other{MatMulIsa::kAvxVnni, 12, 5}, Other{MatMulIsa::kAmx, 18, 17}}) {
      if (!MatMulIsaSupported(o.isa)) continue;
      SetMatMulIsa(o.isa);
      const std::vector<float> got_other = Prefill(*backend, tokens, Blocks(o.first_block, 3), 0);
      const std::vector<float> got_other_chunked =
          Prefill(*backend, tokens, Blocks(o.first_block + 3, 3), o.chunk);
      SetMatMulIsa(MatMulIsa::kAuto);
      EXPECT_EQ(got_other, want) << MatMulIsaName(o.isa);
      EXPECT_EQ(got_other_chunked, want) << MatMulIsaName(o.isa);
    }
  }
}

TEST_P(CpuBackendDTypeTest, HoldsEachWeightOnce) {
  // The tied embeddings are held once, as the packed LM head (each weight at the dtype's size,
  // int8 with an fp32 scale per 32 K rows and K padded to whole blocks, vectors in fp32,
  // panels padded to 64 columns): a second copy of wte for the embedding lookup would add
  // V x E x 4 bytes.
  const DType dtype = GetParam();
  for (const Model* model : Models()) {
    const ModelConfig& c = model->config();
    const int64_t e = c.n_embd;
    auto panels_bytes = [&](int64_t k, int64_t n) {
      const int64_t columns = (n + kPanelWidth - 1) / kPanelWidth * kPanelWidth;
      if (dtype == DType::kI8) {
        const int64_t blocks = (k + kInt8BlockK - 1) / kInt8BlockK;
        return columns * blocks * (kInt8BlockK * 1 + 4);
      }
      return columns * k * DTypeSize(dtype);
    };
    const int64_t matrices = c.n_layer * (panels_bytes(e, 3 * e) + panels_bytes(e, e) +
                                          panels_bytes(e, 4 * e) + panels_bytes(4 * e, e)) +
                             panels_bytes(e, c.vocab_size);
    const int64_t matrix_params = c.n_layer * 12 * e * e + c.vocab_size * e;
    const int64_t vectors = (model->num_parameters() - matrix_params) * 4;
    EXPECT_EQ(MakeBackend(*model, 1, 64, 16, dtype)->memory_usage().weights_bytes,
              matrices + vectors)
        << model->name();
  }
}

TEST_F(CpuBackendTest, HalfPrecisionIsTheF32BackendOnTheRoundedCheckpoint) {
  // --dtype f16|bf16 on an f32 checkpoint rounds every weight at load and computes in fp32:
  // bit for bit what the f32 backend computes from the checkpoint written in that dtype (the
  // same seed), which also loads unchanged into a half-precision backend.
  const std::vector<uint32_t> tokens = RandomTokens(26, 21);
  auto f32 = MakeBackend(*odd_, 2);
  const std::vector<float> f32_logits = Prefill(*f32, tokens, Blocks(0, 2), 0);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const std::unique_ptr<Model> rounded =
        testing::WriteAndLoad(testing::OddModelConfig(), 12, "rounded", dtype);
    ASSERT_NE(rounded, nullptr);
    auto half = MakeBackend(*odd_, 2, 64, 16, dtype);
    EXPECT_EQ(half->dtype(), dtype);
    EXPECT_LT(half->memory_usage().weights_bytes, f32->memory_usage().weights_bytes);
    const std::vector<float> want = Prefill(*MakeBackend(*rounded, 2), tokens, Blocks(0, 2), 5);
    EXPECT_EQ(Prefill(*half, tokens, Blocks(0, 2), 0), want) << DTypeName(dtype);
    EXPECT_EQ(Prefill(*MakeBackend(*rounded, 1, 64, 16, dtype), tokens, Blocks(3, 2), 3), want)
        << DTypeName(dtype);
    // Rounding changes the logits, a little.
    EXPECT_NE(want, f32_logits);
    float max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(want[i] - f32_logits[i]));
      max_abs = std::max(max_abs, std::abs(f32_logits[i]));
    }
    EXPECT_LT(max_diff, 0.05f * max_abs) << DTypeName(dtype);
  }
}

TEST_F(CpuBackendTest, Int8WeightsStayCloseToF32InAboutAQuarterOfTheBytes) {
  // --dtype int8 rounds the matrices (and the tied embeddings) to 8 bits per 32 K rows and
  // the products' rows likewise: the logits move, a little; vectors stay fp32.
  for (const Model* model : Models()) {
    const std::vector<uint32_t> tokens = RandomTokens(26, 22);
    auto f32 = MakeBackend(*model, 2);
    auto int8 = MakeBackend(*model, 2, 64, 16, DType::kI8);
    EXPECT_EQ(int8->dtype(), DType::kI8);
    if (model->config().n_embd % kInt8BlockK == 0) {  // the odd model pads K to whole blocks
      EXPECT_LT(int8->memory_usage().weights_bytes, f32->memory_usage().weights_bytes * 4 / 10);
    }
    const std::vector<float> want = Prefill(*f32, tokens, Blocks(0, 2), 0);
    const std::vector<float> got = Prefill(*int8, tokens, Blocks(0, 2), 0);
    EXPECT_NE(got, want);
    float max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
      max_abs = std::max(max_abs, std::abs(want[i]));
    }
    EXPECT_LT(max_diff, 0.05f * max_abs) << model->name();
  }
}

TEST_F(CpuBackendTest, CopyBlocksMovesExactlyTheRequestedRows) {
  const Model& model = *odd_;
  auto backend = MakeBackend(model, 1, /*num_blocks=*/6, /*block_size=*/4);
  std::vector<float> pool = ReadKvPool(*backend);
  const ModelConfig& c = model.config();
  const int64_t block_floats = int64_t{4} * KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 1);
  ASSERT_EQ(static_cast<int64_t>(pool.size()), 6 * block_floats);
  std::iota(pool.begin(), pool.end(), 0.0f);  // every element distinct (exact below 2^24)
  WriteKvPool(*backend, pool);
  ASSERT_TRUE(backend->CopyBlocks({BlockCopy{1, 4, 3}, BlockCopy{4, 2, 2}}).ok());
  pool = ReadKvPool(*backend);
  const int64_t row_floats = c.head_dim();
  for (int64_t i = 0; i < static_cast<int64_t>(pool.size()); ++i) {
    const int64_t block = i / block_floats;
    const int64_t row = (i / row_floats) % 4;  // rows are the innermost-but-one axis
    float want = static_cast<float>(i);
    if (block == 4 && row < 3) want = static_cast<float>(i - 3 * block_floats);  // from 1
    // Copies run in order: block 4's first rows already hold block 1's values.
    if (block == 2 && row < 2) want = static_cast<float>(i - block_floats);
    ASSERT_EQ(pool[i], want) << "element " << i << " block " << block << " row " << row;
  }
}

TEST_F(CpuBackendTest, KvPoolIsSizedByTheBudgetFormula) {
  const Model& model = *tiny_;
  const ModelConfig& c = model.config();
  const int64_t per_token = KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  CpuBackendOptions o;
  o.model = &model;
  o.kv_pool.block_size = 16;
  o.threads = 1;
  o.kv_pool.budget_bytes = 5 * 16 * per_token + 16 * per_token - 1;  // 5.99 blocks
  auto b = CreateCpuBackend(o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->num_blocks(), 5);
  EXPECT_EQ((*b)->kv_bytes_per_token(), per_token);
  EXPECT_EQ((*b)->memory_usage().kv_pool_bytes, 5 * 16 * per_token);
  EXPECT_EQ((*b)->device_name(), "cpu");
  EXPECT_EQ((*b)->dtype(), DType::kF32);

  o.kv_pool.budget_bytes = 16 * per_token - 1;
  EXPECT_EQ(CreateCpuBackend(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.kv_pool.budget_bytes = 16 * per_token;
  // The flags' errors, each named as the operator types it (ValidateKvPoolOptions, threads).
  for (int32_t bad : {0, 3, 2048}) {
    o.kv_pool.block_size = bad;
    EXPECT_EQ(std::string(CreateCpuBackend(o).status().message()),
              absl::StrCat("--block-size must be a power of two from 1 to 1024, got ", bad));
  }
  o.kv_pool.block_size = 16;
  o.kv_pool.budget_bytes = -1;
  EXPECT_EQ(std::string(CreateCpuBackend(o).status().message()),
            "--kv-cache-bytes must be 0 (the default budget) or positive, got -1");
  o.kv_pool.budget_bytes = 16 * per_token;
  for (int32_t bad : {-1, 1025}) {
    o.threads = bad;
    EXPECT_EQ(std::string(CreateCpuBackend(o).status().message()),
              absl::StrCat("--threads must be 0 (all cores) or 1 to 1024, got ", bad));
  }
  o.threads = 1;
  o.model = nullptr;
  EXPECT_EQ(CreateCpuBackend(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuBackendTest, RejectsBadStepsAndCopiesWithoutWriting) {
  const Model& model = *tiny_;
  auto backend = MakeBackend(model, 1, /*num_blocks=*/4);
  const std::vector<uint32_t> ok_tokens = {1, 2, 3};
  const std::vector<uint32_t> bad_token = {1, 50257};
  const std::vector<int32_t> table = {0}, bad_block = {4}, empty_table = {};
  std::vector<float> logits;
  auto forward = [&](SequenceStep s) {
    // A valid step first: validation happens before anything is written.
    const std::vector<SequenceStep> steps = {{ok_tokens, 0, table, true}, s};
    return backend->Forward(steps, &logits).code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(forward({bad_token, 0, Blocks(1, 1), true}), kInvalid);
  EXPECT_EQ(forward({ok_tokens, 0, bad_block, true}), kInvalid);
  EXPECT_EQ(forward({ok_tokens, 0, empty_table, true}), kInvalid);
  EXPECT_EQ(forward({ok_tokens, 15, Blocks(1, 1), true}), kInvalid);  // needs 2 blocks
  EXPECT_EQ(forward({ok_tokens, model.config().n_positions - 2, Blocks(0, 4), true}),
            kInvalid);  // past the context (and the table)
  EXPECT_EQ(forward({ok_tokens, -1, Blocks(1, 1), true}), kInvalid);
  EXPECT_EQ(forward({{}, 0, Blocks(1, 1), true}), kInvalid);
  EXPECT_EQ(forward({{}, 0, Blocks(1, 1), false}), kInvalid);  // no tokens, no logits
  EXPECT_TRUE(logits.empty());
  // Nothing was written: the pool is still all zeros.
  for (float x : ReadKvPool(*backend)) ASSERT_EQ(x, 0.0f);

  EXPECT_EQ(backend->CopyBlocks({BlockCopy{0, 4, 1}}).code(), kInvalid);
  EXPECT_EQ(backend->CopyBlocks({BlockCopy{-1, 0, 1}}).code(), kInvalid);
  EXPECT_EQ(backend->CopyBlocks({BlockCopy{0, 1, 17}}).code(), kInvalid);
  EXPECT_EQ(backend->CopyBlocks({BlockCopy{1, 1, 1}}).code(), kInvalid);  // onto itself
}

TEST_F(CpuBackendTest, NeverReadsRowsPastThePosition) {
  // NaN in every row the step may not read (other blocks and rows past the sequence end):
  // the logits stay finite and equal to a clean pool's.
  const Model& model = *odd_;
  auto clean = MakeBackend(model, 1, 8);
  auto dirty = MakeBackend(model, 1, 8);
  std::vector<float> pool = ReadKvPool(*dirty);
  std::fill(pool.begin(), pool.end(), std::numeric_limits<float>::quiet_NaN());
  WriteKvPool(*dirty, pool);
  const std::vector<uint32_t> tokens = RandomTokens(19, 8);
  const std::vector<float> want = Prefill(*clean, tokens, {3, 6}, 5);
  const std::vector<float> got = Prefill(*dirty, tokens, {3, 6}, 5);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace prefixd
