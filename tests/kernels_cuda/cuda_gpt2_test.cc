// The CUDA backend on one full-size GPT-2 (124M parameters, random weights in the real
// layout, written by the project's model tool) against the CPU backend: a 12-token prompt,
// then 4 decode steps fed the CPU's greedy token, per dtype. Every logits row is within the
// dtype's tolerance (the same bounds as cuda_backend_test: relative to the row's largest
// |logit|, f32 1e-3, f16 3e-2, bf16 6e-2), and the greedy token is equal wherever the CPU's
// top-2 margin is wider than twice that bound. Skipped where no CUDA device is usable.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels_cuda/cuda_test_util.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

class CudaGpt2Test : public ::testing::TestWithParam<DType> {
 protected:
  static void SetUpTestSuite() {
    if (!CudaDeviceAvailable().ok()) return;
    dir_ = new std::string;
    model_ = cuda_test::WriteAndLoadRandomModel(Gpt2ModelConfig(), 11,
                                                "prefixd_cuda_gpt2_test_model", dir_);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    PREFIXD_SKIP_WITHOUT_CUDA();
    ASSERT_NE(model_, nullptr);
  }

  static std::string* dir_;
  static Model* model_;
};

std::string* CudaGpt2Test::dir_ = nullptr;
Model* CudaGpt2Test::model_ = nullptr;

TEST_P(CudaGpt2Test, PrefillAndDecodeMatchTheCpuBackend) {
  const int64_t vocab = model_->config().vocab_size;
  CudaBackendOptions go;
  go.model = model_;
  go.dtype = GetParam();
  go.kv_pool.budget_bytes = 64 << 20;
  go.kv_pool.block_size = 16;
  go.max_step_tokens = 64;
  go.max_logit_rows = 8;
  auto gpu = CreateCudaBackend(go);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CpuBackendOptions co;
  co.model = model_;
  co.kv_pool.budget_bytes = 64 << 20;
  co.kv_pool.block_size = 16;
  co.threads = 2;
  auto cpu = CreateCpuBackend(co);
  ASSERT_TRUE(cpu.ok()) << cpu.status();

  std::mt19937 rng(5);
  std::vector<uint32_t> tokens(12);
  for (uint32_t& t : tokens) t = rng() % vocab;
  const std::vector<int32_t> table = {2, 7};
  const double tol = cuda_test::LogitTolerance(GetParam());
  int compared = 0;
  for (int step = 0; step < 5; ++step) {
    SequenceStep s;
    const int n = step == 0 ? static_cast<int>(tokens.size()) : 1;
    s.token_ids = absl::MakeConstSpan(tokens).subspan(tokens.size() - n);
    s.start_pos = static_cast<int32_t>(tokens.size()) - n;
    s.block_table = table;
    s.want_logits = true;
    std::vector<float> g, c;
    ASSERT_TRUE((*gpu)->Forward({&s, 1}, &g).ok());
    ASSERT_TRUE((*cpu)->Forward({&s, 1}, &c).ok());
    ASSERT_EQ(g.size(), static_cast<size_t>(vocab));
    ASSERT_EQ(c.size(), static_cast<size_t>(vocab));
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double d = std::fabs(static_cast<double>(g[i]) - c[i]);
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
      scale = std::max(scale, std::fabs(static_cast<double>(c[i])));
    }
    EXPECT_LE(diff / scale, tol) << "step " << step;
    std::printf("[measured] %s step %d: max relative logit error vs CPU %.3g\n",
                std::string(DTypeName(GetParam())).c_str(), step, diff / scale);
    std::vector<int64_t> order(vocab);
    for (int64_t i = 0; i < vocab; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](int64_t a, int64_t b) { return c[a] > c[b]; });
    const int64_t best = order[0];
    if (c[order[0]] - c[order[1]] > 2 * tol * scale) {
      ++compared;
      EXPECT_EQ(std::max_element(g.begin(), g.end()) - g.begin(), best) << "step " << step;
    }
    tokens.push_back(static_cast<uint32_t>(best));
  }
  std::printf("[measured] %d of 5 steps had a clear top-2 margin\n", compared);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CudaGpt2Test,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         cuda_test::DTypeParamName);

}  // namespace
}  // namespace prefixd
