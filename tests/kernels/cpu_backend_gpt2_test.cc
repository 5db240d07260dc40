// The one full-size exactness test: random GPT-2 small (124M) against the double reference
// on a short prompt, prefill then one cached decode step. Not "core": too big for the
// sanitizer pass.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/reference_gpt2.h"
#include "tests/kernels/test_models.h"

namespace prefixd {
namespace {

double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

TEST(CpuBackendGpt2Test, FullSizeModelMatchesDoubleReference) {
  std::unique_ptr<Model> model = testing::WriteAndLoad(Gpt2ModelConfig(), 5, "gpt2");
  ASSERT_NE(model, nullptr);
  auto backend = testing::MakeBackend(*model, 2, /*num_blocks=*/2);
  testing::ReferenceGpt2 ref(*model);
  std::vector<uint32_t> tokens = testing::RandomTokens(7, 9);
  const std::vector<int32_t> table = {1, 0};
  std::vector<float> logits = testing::Prefill(*backend, tokens, table, 0);
  ASSERT_EQ(logits.size(), 50257u);
  EXPECT_LE(RelativeError(logits, ref.LastLogits(tokens)), 1e-4);

  tokens.push_back(
      static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  logits = testing::Prefill(*backend, tokens, table, 0, /*from=*/7);
  EXPECT_LE(RelativeError(logits, ref.LastLogits(tokens)), 1e-4);
}

}  // namespace
}  // namespace prefixd
