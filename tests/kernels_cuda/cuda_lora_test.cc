// LoRA adapters on the CUDA backend: the update kernel against a CPU twin, a batch mixing the
// base and three adapters against each sequence alone, the backend against the CPU backend's
// LoRA output, decode graphs with changing mixes of adapters, and the device copies (keyed by
// digest, bounded, reported). Skipped where no CUDA device is usable: compiled in CI, not yet
// run on a GPU (scripts/gpu-check lists it).
//
// Tolerances: the kernel test, 1e-4 absolute + 1e-4 relative (fp32 arithmetic on the same
// dtype-rounded inputs; only the summation order differs from the twin). Backend tests use
// cuda_backend_test.cc's rule, max |a - b| over a logits row relative to max |b| of that row:
// f32 1e-3, f16 3e-2, bf16 6e-2 (the f16/bf16 bounds provisional, as there), for GPU vs CPU
// and for GPU vs GPU (another batch, graph vs eager) alike.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/lora_adapter.h"
#include "engine/model.h"
#include "engine/tokenizer.h"  // Model's destructor needs the complete type
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/lora_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/lora_plan.h"
#include "kernels/cuda/lora_update.cuh"
#include "tests/kernels_cuda/cuda_test_util.h"
#include "tools/random_adapter.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::Encode;
using cuda_test::ExpectClose;
using cuda_test::RandomVector;
using cuda_test::Round;

using cuda_test::LogitTolerance;

// max |a - b| / max |b| over one row; NaN gives infinity.
double RowError(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    diff = std::max(diff, d);
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// ---- The kernel ----

class CudaLoraKernelTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { PREFIXD_SKIP_WITHOUT_CUDA(); }
  DType dt() const { return GetParam(); }
  std::mt19937 rng_{4321};
};

// Rows: base, adapter P (rank 8), adapter Q (rank 3), P again, a row whose adapter leaves the
// module alone. The base row and the untouched one keep their bits; the others get the twin's
// update (AddLoraUpdateRowReference on the same rounded A, B and x).
TEST_P(CudaLoraKernelTest, EachRowGetsItsOwnAdaptersUpdate) {
  for (auto [in, out] : std::vector<std::pair<int, int>>{{96, 288}, {37, 300}, {512, 128}}) {
    const int rows = 5;
    const std::vector<float> x = Round(RandomVector(rows * in, &rng_), dt());
    const std::vector<float> y0 = RandomVector(rows * out, &rng_, -4, 4);
    struct Host {
      int32_t rank;
      float scaling;
      std::vector<float> a, b_t;  // [rank, in], [rank, out]
    };
    std::vector<Host> adapters = {{8, 2.0f, {}, {}}, {3, 0.5f, {}, {}}};
    for (Host& h : adapters) {
      h.a = Round(RandomVector(h.rank * in, &rng_), dt());
      h.b_t = Round(RandomVector(h.rank * out, &rng_), dt());
    }
    DeviceBuffer d_x(Encode(x, dt())), d_y(y0);
    DeviceBuffer d_a0(Encode(adapters[0].a, dt())), d_b0(Encode(adapters[0].b_t, dt()));
    DeviceBuffer d_a1(Encode(adapters[1].a, dt())), d_b1(Encode(adapters[1].b_t, dt()));
    ASSERT_TRUE(d_x.ok() && d_y.ok() && d_a0.ok() && d_b0.ok() && d_a1.ok() && d_b1.ok());
    // Module tables of two entries: the update is module 1; P leaves module 0 alone, Q has
    // only module 1, the "untouched" adapter (R) only module 0.
    const std::vector<cuda::LoraModuleDevice> p_table = {{}, {d_a0.get(), d_b0.get()}};
    const std::vector<cuda::LoraModuleDevice> q_table = {{}, {d_a1.get(), d_b1.get()}};
    const std::vector<cuda::LoraModuleDevice> r_table = {{d_a0.get(), d_b0.get()}, {}};
    DeviceBuffer d_p(p_table), d_q(q_table), d_r(r_table);
    ASSERT_TRUE(d_p.ok() && d_q.ok() && d_r.ok());
    const std::vector<cuda::LoraRowDevice> row_table = {
        {},
        {d_p.get<cuda::LoraModuleDevice>(), 8, 2.0f},
        {d_q.get<cuda::LoraModuleDevice>(), 3, 0.5f},
        {d_p.get<cuda::LoraModuleDevice>(), 8, 2.0f},
        {d_r.get<cuda::LoraModuleDevice>(), 8, 2.0f}};
    DeviceBuffer d_rows(row_table);
    ASSERT_TRUE(d_rows.ok());
    cuda::LoraUpdateArgs args;
    args.rows = d_rows.get<cuda::LoraRowDevice>();
    args.num_rows = rows;
    args.module = 1;
    args.x = d_x.get();
    args.ld_x = in;
    args.in = in;
    args.y = d_y.get<float>();
    args.ld_y = out;
    args.out = out;
    PREFIXD_ASSERT_CUDA(cuda::LaunchLoraUpdate(dt(), args, nullptr));
    const std::vector<float> got = d_y.Download<float>();
    std::vector<float> want = y0;
    const int which[rows] = {-1, 0, 1, 0, -1};
    for (int r = 0; r < rows; ++r) {
      if (which[r] < 0) continue;
      const Host& h = adapters[which[r]];
      LoraModule m;
      m.in = in;
      m.out = out;
      m.a_t.resize(static_cast<size_t>(in) * h.rank);
      for (int j = 0; j < h.rank; ++j) {
        for (int k = 0; k < in; ++k) m.a_t[k * h.rank + j] = h.a[j * in + k];
      }
      m.b_t = h.b_t;
      AddLoraUpdateRowReference(m, h.rank, h.scaling, &x[r * in], &want[r * out]);
    }
    ExpectClose(got, want, {1e-4, 1e-4}, "lora update in=" + std::to_string(in));
    for (int r : {0, 4}) {
      EXPECT_TRUE(
          std::equal(got.begin() + r * out, got.begin() + (r + 1) * out, y0.begin() + r * out))
          << "row " << r << " must keep its bits";
    }
    // The update is not negligible, or the comparison would prove nothing.
    double moved = 0;
    for (int o = 0; o < out; ++o)
      moved = std::max(moved, std::fabs(double{got[out + o]} - y0[out + o]));
    EXPECT_GT(moved, 0.1);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CudaLoraKernelTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         cuda_test::DTypeParamName);

// ---- The backend ----

class CudaLoraBackendTest : public ::testing::TestWithParam<DType> {
 protected:
  static void SetUpTestSuite() {
    if (!CudaDeviceAvailable().ok()) return;
    root_ = new std::string(cuda_test::UniqueTempDir("prefixd_cuda_lora_test"));
    RandomModelOptions o;
    o.out_dir = *root_ + "/model";
    o.config = TinyModelConfig();
    o.seed = 7;
    o.dtype = DType::kF32;
    ASSERT_TRUE(WriteRandomModel(o).ok());
    auto model = Model::Load(o.out_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    // Three different adapters, as the CPU backend's tests: rank 4 on every module; rank 8
    // with rslora; rank 2 on c_attn only.
    RandomAdapterOptions a;
    a.rank = 4;
    a.lora_alpha = 8;
    a.seed = 1;
    a.b_std = 0.1f;
    RandomAdapterOptions b = a;
    b.rank = 8;
    b.use_rslora = true;
    b.seed = 2;
    RandomAdapterOptions c = a;
    c.rank = 2;
    c.target_modules = {"c_attn"};
    c.seed = 3;
    adapters_ = new std::vector<std::shared_ptr<const LoraAdapter>>;
    int i = 0;
    for (const RandomAdapterOptions& opts : {a, b, c}) {
      adapters_->push_back(Write(*root_ + "/adapter" + std::to_string(i++), opts));
    }
  }
  static void TearDownTestSuite() {
    delete adapters_;
    adapters_ = nullptr;
    delete model_;
    model_ = nullptr;
    if (root_ != nullptr) std::filesystem::remove_all(*root_);
    delete root_;
    root_ = nullptr;
  }
  static std::shared_ptr<const LoraAdapter> Write(const std::string& dir,
                                                  const RandomAdapterOptions& o) {
    const absl::Status written = WriteRandomAdapter(dir, model_->config(), o);
    EXPECT_TRUE(written.ok()) << written;
    auto adapter = LoadLoraAdapter(dir, model_->config());
    EXPECT_TRUE(adapter.ok()) << adapter.status();
    return adapter.ok() ? *adapter : nullptr;
  }

  void SetUp() override {
    PREFIXD_SKIP_WITHOUT_CUDA();
    ASSERT_NE(model_, nullptr);
    ASSERT_EQ(adapters_->size(), 3u);
    for (const auto& a : *adapters_) ASSERT_NE(a, nullptr);
    vocab_ = model_->config().vocab_size;
  }

  CudaBackendOptions Options(bool graphs = true) {
    CudaBackendOptions o;
    o.model = model_;
    o.dtype = GetParam();
    o.kv_pool.budget_bytes = 64 << 20;
    o.kv_pool.block_size = 16;
    o.use_cuda_graphs = graphs;
    return o;
  }
  std::unique_ptr<Backend> Create(const CudaBackendOptions& o) {
    auto b = CreateCudaBackend(o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }
  std::unique_ptr<Backend> Cuda(bool graphs = true) { return Create(Options(graphs)); }
  std::unique_ptr<Backend> Cpu() {
    CpuBackendOptions o;
    o.model = model_;
    o.kv_pool.budget_bytes = 16 << 20;
    o.kv_pool.block_size = 16;
    o.threads = 2;
    auto b = CreateCpuBackend(o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }

  std::vector<uint32_t> RandomTokens(int n) {
    std::vector<uint32_t> t(n);
    for (uint32_t& x : t) x = rng_() % vocab_;
    return t;
  }

  // One sequence of a run: its prompt, the tokens it decodes (fixed, so that every run sees
  // the same), its blocks and adapter.
  struct Seq {
    std::vector<uint32_t> tokens;
    int prompt = 0;
    std::vector<int32_t> table;
    const LoraAdapter* adapter = nullptr;
  };

  // Prefill every sequence in one step, then decode the rest of their tokens one per step
  // (all in one batch each step); per step, each sequence's logits row.
  static std::vector<std::vector<std::vector<float>>> Run(Backend& backend,
                                                          const std::vector<Seq>& seqs,
                                                          int decode_steps, int64_t vocab) {
    std::vector<std::vector<std::vector<float>>> out;
    for (int step = 0; step <= decode_steps; ++step) {
      std::vector<SequenceStep> steps(seqs.size());
      for (size_t s = 0; s < seqs.size(); ++s) {
        const int begin = step == 0 ? 0 : seqs[s].prompt + step - 1;
        const int end = seqs[s].prompt + step;
        steps[s].token_ids = absl::MakeConstSpan(seqs[s].tokens).subspan(begin, end - begin);
        steps[s].start_pos = begin;
        steps[s].block_table = seqs[s].table;
        steps[s].want_logits = true;
        steps[s].adapter = seqs[s].adapter;
      }
      std::vector<float> logits;
      const absl::Status st = backend.Forward(steps, &logits);
      EXPECT_TRUE(st.ok()) << st;
      EXPECT_EQ(logits.size(), seqs.size() * vocab);
      std::vector<std::vector<float>> rows(seqs.size());
      for (size_t s = 0; s < seqs.size() && (s + 1) * vocab <= logits.size(); ++s) {
        rows[s].assign(logits.begin() + s * vocab, logits.begin() + (s + 1) * vocab);
      }
      out.push_back(std::move(rows));
    }
    return out;
  }

  // Base, adapter 0, 1, 2 (and adapter 0 once more), each with its own blocks.
  std::vector<Seq> MixedBatch(int decode_steps) {
    std::vector<Seq> seqs;
    const std::vector<int> prompts = {9, 21, 5, 33, 14};
    const std::vector<const LoraAdapter*> adapters = {nullptr, (*adapters_)[0].get(),
                                                      (*adapters_)[1].get(), (*adapters_)[2].get(),
                                                      (*adapters_)[0].get()};
    for (size_t s = 0; s < prompts.size(); ++s) {
      Seq q;
      q.prompt = prompts[s];
      q.tokens = RandomTokens(prompts[s] + decode_steps);
      for (int k = 0; k < 4; ++k) q.table.push_back(static_cast<int32_t>(1 + s + 8 * k));
      q.adapter = adapters[s];
      seqs.push_back(std::move(q));
    }
    return seqs;
  }

  static inline std::string* root_ = nullptr;
  static inline Model* model_ = nullptr;
  static inline std::vector<std::shared_ptr<const LoraAdapter>>* adapters_ = nullptr;
  int64_t vocab_ = 0;
  std::mt19937 rng_{77};
};

TEST_P(CudaLoraBackendTest, AppliesLora) {
  auto gpu = Cuda();
  ASSERT_TRUE(gpu);
  EXPECT_TRUE(gpu->applies_lora());
  EXPECT_EQ(gpu->memory_usage().adapter_bytes, 0);
}

// A batch of the base and three adapters (one of them on two rows), prefill then decode
// through graphs: every row equals its sequence run alone, and each adapter visibly changes
// its row against the base on the same tokens.
TEST_P(CudaLoraBackendTest, BatchOfBaseAndThreeAdaptersEqualsEachAlone) {
  auto batched = Cuda();
  auto alone = Cuda();
  ASSERT_TRUE(batched && alone);
  const int decode_steps = 4;
  const std::vector<Seq> seqs = MixedBatch(decode_steps);
  const auto together = Run(*batched, seqs, decode_steps, vocab_);
  const double tol = LogitTolerance(GetParam());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto single = Run(*alone, {seqs[s]}, decode_steps, vocab_);
    Seq base = seqs[s];
    base.adapter = nullptr;
    for (int32_t& b : base.table) b += 40;
    const auto as_base = Run(*alone, {base}, decode_steps, vocab_);
    for (int step = 0; step <= decode_steps; ++step) {
      ASSERT_EQ(together[step][s].size(), static_cast<size_t>(vocab_));
      ASSERT_EQ(single[step][0].size(), static_cast<size_t>(vocab_));
      const double err = RowError(together[step][s].data(), single[step][0].data(), vocab_);
      EXPECT_LE(err, tol) << "sequence " << s << " step " << step;
      if (seqs[s].adapter != nullptr) {
        EXPECT_GT(RowError(as_base[step][0].data(), single[step][0].data(), vocab_), 4 * tol)
            << "adapter of sequence " << s << " hardly changes step " << step;
      }
    }
  }
}

// The same mixed batch against the CPU backend's LoRA output (the bit-exact reference).
TEST_P(CudaLoraBackendTest, MatchesCpuBackendWithAdapters) {
  auto gpu = Cuda();
  auto cpu = Cpu();
  ASSERT_TRUE(gpu && cpu);
  const int decode_steps = 4;
  const std::vector<Seq> seqs = MixedBatch(decode_steps);
  const auto g = Run(*gpu, seqs, decode_steps, vocab_);
  const auto c = Run(*cpu, seqs, decode_steps, vocab_);
  const double tol = LogitTolerance(GetParam());
  double worst = 0;
  for (int step = 0; step <= decode_steps; ++step) {
    for (size_t s = 0; s < seqs.size(); ++s) {
      ASSERT_EQ(g[step][s].size(), c[step][s].size());
      const double err = RowError(g[step][s].data(), c[step][s].data(), vocab_);
      EXPECT_LE(err, tol) << "sequence " << s << " step " << step;
      worst = std::max(worst, err);
    }
  }
  std::printf("[measured] %s LoRA max relative logit error vs CPU: %.3g (tolerance %.3g)\n",
              std::string(DTypeName(GetParam())).c_str(), worst, tol);
}

// Decode batches of one shape whose rows change adapters from step to step (base -> adapter,
// adapter -> another): one graph per (bucket, splits, has adapters) replays them all, and
// agrees with an eager backend; nothing falls back.
TEST_P(CudaLoraBackendTest, DecodeGraphsFollowChangingMixesOfAdapters) {
  auto graphs = Cuda(true);
  auto eager = Cuda(false);
  ASSERT_TRUE(graphs && eager);
  const double tol = LogitTolerance(GetParam());
  const std::vector<const LoraAdapter*> choices = {nullptr, (*adapters_)[0].get(),
                                                   (*adapters_)[1].get(), (*adapters_)[2].get()};
  std::vector<std::vector<uint32_t>> tokens = {RandomTokens(6), RandomTokens(11), RandomTokens(3)};
  const std::vector<std::vector<int32_t>> tables = {{50, 51}, {52, 53}, {54, 55}};
  // A prefill of the base, then decode steps whose adapters rotate. (Each row's K/V then mixes
  // adapters across positions: a different computation, but the same one on both backends.)
  for (int step = 0; step < 7; ++step) {
    std::vector<SequenceStep> steps(3);
    for (int s = 0; s < 3; ++s) {
      const int n = step == 0 ? static_cast<int>(tokens[s].size()) : 1;
      steps[s].token_ids = absl::MakeConstSpan(tokens[s]).subspan(tokens[s].size() - n);
      steps[s].start_pos = static_cast<int32_t>(tokens[s].size()) - n;
      steps[s].block_table = tables[s];
      steps[s].want_logits = true;
      steps[s].adapter = step == 0 ? nullptr : choices[(step + s) % choices.size()];
    }
    std::vector<float> a, b;
    ASSERT_TRUE(graphs->Forward(steps, &a).ok());
    ASSERT_TRUE(eager->Forward(steps, &b).ok());
    ASSERT_EQ(a.size(), b.size());
    for (int s = 0; s < 3; ++s) {
      EXPECT_LE(RowError(&a[s * vocab_], &b[s * vocab_], vocab_), tol)
          << "step " << step << " row " << s;
    }
    for (int s = 0; s < 3; ++s) tokens[s].push_back(static_cast<uint32_t>(rng_() % vocab_));
  }
  EXPECT_EQ(graphs->counters().graph_fallbacks, 0);
}

// Device copies: uploaded on first use and reported; with room for one adapter between
// steps the other is evicted (and comes back when used again); a name reloaded with other
// files has another digest and gets its own device weights, not the first files' copy.
TEST_P(CudaLoraBackendTest, DeviceCopiesAreKeyedByDigestBoundedAndReported) {
  CudaBackendOptions o = Options();
  o.max_device_adapters = 1;
  auto gpu = Create(o);
  auto fresh = Cuda();
  ASSERT_TRUE(gpu && fresh);
  const LoraAdapter& a = *(*adapters_)[0];
  const LoraAdapter& b = *(*adapters_)[1];
  const int64_t elt = DTypeSize(GetParam());
  auto bytes = [&](const LoraAdapter& x) {
    return cuda::PlanLoraArena(x, model_->config().n_layer, elt, sizeof(cuda::LoraModuleDevice))
        .bytes;
  };
  const std::vector<uint32_t> tokens = RandomTokens(12);
  const std::vector<int32_t> table = {3};
  auto logits = [&](Backend& backend, const LoraAdapter* adapter) {
    SequenceStep s;
    s.token_ids = tokens;
    s.block_table = table;
    s.want_logits = true;
    s.adapter = adapter;
    std::vector<float> out;
    const absl::Status st = backend.Forward({&s, 1}, &out);
    EXPECT_TRUE(st.ok()) << st;
    return out;
  };
  const std::vector<float> with_a = logits(*gpu, &a);
  EXPECT_EQ(gpu->memory_usage().adapter_bytes, bytes(a));
  logits(*gpu, &b);
  EXPECT_EQ(gpu->memory_usage().adapter_bytes, bytes(b));  // a evicted
  {
    // Both in one step: both resident for it, beyond the cap of one.
    const std::vector<int32_t> other = {4};
    std::vector<SequenceStep> steps(2);
    for (int i = 0; i < 2; ++i) {
      steps[i].token_ids = tokens;
      steps[i].block_table = i == 0 ? table : other;
      steps[i].want_logits = true;
      steps[i].adapter = i == 0 ? &a : &b;
    }
    std::vector<float> out;
    ASSERT_TRUE(gpu->Forward(steps, &out).ok());
    EXPECT_EQ(gpu->memory_usage().adapter_bytes, bytes(a) + bytes(b));
    EXPECT_LE(RowError(out.data(), with_a.data(), vocab_), LogitTolerance(GetParam()));
  }
  // The same directory rewritten with other weights, loaded again: another digest.
  const std::string dir = *root_ + "/reloaded";
  RandomAdapterOptions first;
  first.rank = 4;
  first.lora_alpha = 8;
  first.b_std = 0.1f;
  first.seed = 11;
  RandomAdapterOptions second = first;
  second.seed = 12;
  const auto v1 = Write(dir, first);
  const auto v2 = Write(dir, second);
  ASSERT_TRUE(v1 && v2);
  ASSERT_NE(v1->digest, v2->digest);
  ASSERT_EQ(v1->dir, v2->dir);
  const std::vector<float> l1 = logits(*gpu, v1.get());
  const std::vector<float> l2 = logits(*gpu, v2.get());
  const double tol = LogitTolerance(GetParam());
  EXPECT_GT(RowError(l2.data(), l1.data(), vocab_), 4 * tol) << "v2 ran with v1's weights";
  EXPECT_LE(RowError(l2.data(), logits(*fresh, v2.get()).data(), vocab_), tol);
  EXPECT_EQ(gpu->memory_usage().adapter_bytes, bytes(*v2));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CudaLoraBackendTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         cuda_test::DTypeParamName);

}  // namespace
}  // namespace prefixd
