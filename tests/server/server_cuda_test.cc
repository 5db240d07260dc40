// prefixd --device cuda end to end: the built binary on the tiny random model and a random
// LoRA adapter, against prefixd --device cpu on the same files, over gRPC and HTTP. In an
// interpret build (PREFIXD_CUDA_INTERPRET) the device is kernels/cuda/interpret on the CPU
// and every test runs; elsewhere they need a usable GPU and skip without one.
//
// Tolerances (|cuda - cpu| of a log-probability, in nats): f32 1e-4 (the CUDA backend's
// bound; the interpreter measures under 1e-5); bf16 0.15, about three times the 0.052 the
// interpreter measures on these prompts, for a GPU's other summation order. Greedy ids are
// compared at f32 only, where no random-model margin is that thin.
#include <signal.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/http_client.h"
#include "engine/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "nlohmann/json.hpp"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"
#include "tools/random_adapter.h"
#include "tools/random_model.h"

namespace prefixd::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr double kF32Tolerance = 1e-4;
constexpr double kBf16Tolerance = 0.15;

class ServerCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!CudaDeviceAvailable().ok()) return;
    dir_ = new TempDir();
    const std::string model = dir_->path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model).ok());
    RandomAdapterOptions a;
    a.seed = 3;
    a.b_std = 0.5f;  // large enough to change greedy tokens
    ASSERT_TRUE(WriteRandomAdapter(dir_->path() + "/adapter", TinyModelConfig(), a).ok());
    auto start = [&](const std::vector<std::string>& device) -> ServerProcess* {
      std::vector<std::string> flags = device;
      for (const char* f : {"--kv-cache-bytes", "4194304", "--adapter"}) flags.push_back(f);
      flags.push_back("a=" + dir_->path() + "/adapter");
      absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start(model, flags);
      EXPECT_TRUE(s.ok()) << s.status();
      return s.ok() ? s->release() : nullptr;
    };
    cpu_ = start({"--device", "cpu", "--dtype", "f32"});
    cuda_ = start({"--device", "cuda", "--dtype", "f32"});
    bf16_ = start({"--device", "cuda", "--dtype", "bf16"});
  }
  static void TearDownTestSuite() {
    delete cpu_;
    delete cuda_;
    delete bf16_;
    delete dir_;
    cpu_ = cuda_ = bf16_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (absl::Status s = CudaDeviceAvailable(); !s.ok()) GTEST_SKIP() << s.message();
    ASSERT_TRUE(cpu_ != nullptr && cuda_ != nullptr && bf16_ != nullptr);
  }

  static std::unique_ptr<v1::Inference::Stub> Stub(ServerProcess* s) {
    return v1::Inference::NewStub(InsecureChannel(s->address()));
  }
  static json Post(ServerProcess* s, const json& body) {
    absl::StatusOr<bench::HttpResponse> r =
        bench::HttpFetch(s->http_port(), "POST", "/v1/completions", body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                          const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
      EXPECT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), tol) << what << " at " << i;
    }
    std::printf("[measured] %s: max |dlogprob| %.3g over %zu\n", what.c_str(), worst, got.size());
  }

  static inline TempDir* dir_ = nullptr;
  static inline ServerProcess* cpu_ = nullptr;
  static inline ServerProcess* cuda_ = nullptr;
  static inline ServerProcess* bf16_ = nullptr;
};

TEST_F(ServerCudaTest, StartUpLineAndModelInfoNameTheDevice) {
  v1::GetModelInfoRequest req;
  v1::ModelInfo info;
  grpc::ClientContext ctx;
  ASSERT_TRUE(Stub(cuda_)->GetModelInfo(&ctx, req, &info).ok());
  EXPECT_EQ(info.dtype(), "f32");
  if (CudaDeviceIsInterpreted()) {
    EXPECT_EQ(info.device(), "cuda:0 (interpreted on the CPU)");
    EXPECT_THAT(cuda_->process().Output(), HasSubstr("device cuda:0 (interpreted on the CPU)"));
  } else {
    EXPECT_EQ(info.device(), "cuda:0");
  }
}

// Greedy decoding with per-token logprobs, three prompts in one batch of requests: the
// same ids as the CPU's, logprobs within the f32 bound. Then the same prompts again: served
// from the cache (cached_prompt_tokens > 0), the same ids and logprobs within the bound.
TEST_F(ServerCudaTest, GreedyGenerationMatchesTheCpuServerColdAndCached) {
  auto cpu = Stub(cpu_);
  auto cuda = Stub(cuda_);
  for (uint32_t seed : {1u, 2u, 3u}) {
    v1::GenerateRequest req = IdsRequest(RandomIds(seed, 40), 12);
    req.set_temperature(0);
    req.set_cache_salt(absl::StrCat("greedy-", seed));
    const GenerateResult want = Generate(*cpu, req);
    const GenerateResult cold = Generate(*cuda, req);
    const GenerateResult cached = Generate(*cuda, req);
    ASSERT_TRUE(want.status.ok() && cold.status.ok() && cached.status.ok())
        << cold.status.error_message();
    EXPECT_EQ(cold.samples.at(0).token_ids, want.samples.at(0).token_ids) << seed;
    EXPECT_EQ(cached.samples.at(0).token_ids, want.samples.at(0).token_ids) << seed;
    ExpectClose(cold.samples.at(0).logprobs, want.samples.at(0).logprobs, kF32Tolerance,
                absl::StrCat("f32 cold generation ", seed));
    ExpectClose(cached.samples.at(0).logprobs, cold.samples.at(0).logprobs, kF32Tolerance,
                absl::StrCat("f32 cached vs cold ", seed));
    EXPECT_EQ(cold.usage.cached_prompt_tokens(), 0u);
    EXPECT_GT(cached.usage.cached_prompt_tokens(), 0u);
  }
}

// n samples forked from one prompt (the fork shares the prompt's blocks and copies the
// partial one): with a seed, each sample's ids equal the CPU server's.
TEST_F(ServerCudaTest, SampledForkMatchesTheCpuServer) {
  v1::GenerateRequest req = IdsRequest(RandomIds(9, 21), 10);
  req.set_temperature(1.0f);
  req.set_seed(77);
  req.set_num_samples(3);
  const GenerateResult want = Generate(*Stub(cpu_), req);
  const GenerateResult got = Generate(*Stub(cuda_), req);
  ASSERT_TRUE(want.status.ok() && got.status.ok()) << got.status.error_message();
  ASSERT_EQ(got.samples.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got.samples.at(i).token_ids, want.samples.at(i).token_ids) << "sample " << i;
    ExpectClose(got.samples.at(i).logprobs, want.samples.at(i).logprobs, kF32Tolerance,
                absl::StrCat("f32 sample ", i));
  }
}

// Prompt logprobs over gRPC (max_new_tokens 0): every position within the bound of the CPU's,
// at f32 and bf16; the second request is scored from the cache's score records and agrees.
TEST_F(ServerCudaTest, PromptLogprobsMatchTheCpuServer) {
  v1::GenerateRequest req = IdsRequest(RandomIds(21, 50), 0);
  req.set_prompt_logprobs(2);
  req.set_cache_salt("scoring");
  const GenerateResult want = Generate(*Stub(cpu_), req);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_FALSE(want.messages.empty());
  const v1::GenerateResponse& w = want.messages[0];
  ASSERT_EQ(w.prompt_logprobs_size(), 49);
  for (ServerProcess* s : {cuda_, bf16_}) {
    const bool f32 = s == cuda_;
    const GenerateResult cold = Generate(*Stub(s), req);
    const GenerateResult cached = Generate(*Stub(s), req);
    ASSERT_TRUE(cold.status.ok() && cached.status.ok()) << cold.status.error_message();
    const v1::GenerateResponse& c = cold.messages[0];
    const v1::GenerateResponse& k = cached.messages[0];
    EXPECT_EQ(std::vector<uint32_t>(c.prompt_token_ids().begin(), c.prompt_token_ids().end()),
              std::vector<uint32_t>(w.prompt_token_ids().begin(), w.prompt_token_ids().end()));
    const std::vector<float> want_lp(w.prompt_logprobs().begin(), w.prompt_logprobs().end());
    const std::vector<float> cold_lp(c.prompt_logprobs().begin(), c.prompt_logprobs().end());
    const std::vector<float> cached_lp(k.prompt_logprobs().begin(), k.prompt_logprobs().end());
    const double tol = f32 ? kF32Tolerance : kBf16Tolerance;
    ExpectClose(cold_lp, want_lp, tol, f32 ? "f32 prompt logprobs" : "bf16 prompt logprobs");
    ExpectClose(cached_lp, cold_lp, tol, f32 ? "f32 cached prompt logprobs" : "bf16 cached");
    EXPECT_GT(cached.usage.cached_prompt_tokens(), 0u);
  }
}

// lm-evaluation-harness's local-completions loglikelihood request, in its exact shape
// (token ids, temperature 0, max_tokens 1, logprobs 1, seed 1234, echo), over HTTP.
TEST_F(ServerCudaTest, LmEvalLoglikelihoodRequestMatchesTheCpuServer) {
  const json body = {{"model", "tiny-model"}, {"prompt", {RandomIds(31, 30), RandomIds(32, 17)}},
                     {"temperature", 0},      {"max_tokens", 1},
                     {"logprobs", 1},         {"seed", 1234},
                     {"echo", true}};
  const json want = Post(cpu_, body);
  const json got = Post(cuda_, body);
  ASSERT_EQ(got["choices"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& w = want["choices"][i]["logprobs"];
    const json& g = got["choices"][i]["logprobs"];
    ASSERT_EQ(g["tokens"], w["tokens"]) << i;
    ASSERT_EQ(g["token_logprobs"].size(), w["token_logprobs"].size());
    EXPECT_TRUE(g["token_logprobs"][0].is_null());
    std::vector<float> wl, gl;
    for (size_t t = 1; t < w["token_logprobs"].size(); ++t) {
      wl.push_back(w["token_logprobs"][t].get<float>());
      gl.push_back(g["token_logprobs"][t].get<float>());
    }
    ExpectClose(gl, wl, kF32Tolerance, absl::StrCat("f32 lm-eval choice ", i));
  }
}

// A LoRA adapter (loaded at start-up): greedy ids equal the CPU server's with the adapter,
// and differ from the base model's.
TEST_F(ServerCudaTest, AdapterGenerationMatchesTheCpuServer) {
  v1::GenerateRequest req = IdsRequest(RandomIds(41, 24), 12);
  req.set_temperature(0);
  const GenerateResult base = Generate(*Stub(cuda_), req);
  req.set_adapter("a");
  const GenerateResult want = Generate(*Stub(cpu_), req);
  const GenerateResult got = Generate(*Stub(cuda_), req);
  ASSERT_TRUE(base.status.ok() && want.status.ok() && got.status.ok())
      << got.status.error_message();
  EXPECT_EQ(got.samples.at(0).token_ids, want.samples.at(0).token_ids);
  EXPECT_NE(got.samples.at(0).token_ids, base.samples.at(0).token_ids);
  ExpectClose(got.samples.at(0).logprobs, want.samples.at(0).logprobs, kF32Tolerance,
              "f32 adapter generation");
}

// The disk tier on the CUDA backend: a drain writes the pool's blocks to --cache-dir
// (ReadKvBlock), a restart loads them back (WriteKvBlock) and serves the prompt from them:
// 63 of 64 prompt tokens cached, the same ids and logprobs as the first run.
TEST_F(ServerCudaTest, BlocksSpilledToDiskComeBackAcrossARestart) {
  const std::string cache_dir = dir_->path() + "/kv-cache";
  auto start = [&] {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start(
        dir_->path() + "/tiny-model", {"--device", "cuda", "--dtype", "f32", "--kv-cache-bytes",
                                       "4194304", "--cache-dir", cache_dir});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  };
  v1::GenerateRequest req = IdsRequest(RandomIds(7, 64), 8);  // 4 blocks of 16
  req.set_temperature(0);
  GenerateResult cold;
  {
    std::unique_ptr<ServerProcess> first = start();
    ASSERT_NE(first, nullptr);
    cold = Generate(*Stub(first.get()), req);
    ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
    first->process().Signal(SIGTERM);
    EXPECT_EQ(first->process().Wait(absl::Seconds(60)), 0) << first->process().Output();
  }
  std::unique_ptr<ServerProcess> second = start();
  ASSERT_NE(second, nullptr);
  EXPECT_THAT(second->process().Output(), HasSubstr("4 blocks"));
  const GenerateResult warm = Generate(*Stub(second.get()), req);
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  EXPECT_EQ(warm.usage.cached_prompt_tokens(), 63u);
  EXPECT_EQ(warm.samples.at(0).token_ids, cold.samples.at(0).token_ids);
  ExpectClose(warm.samples.at(0).logprobs, cold.samples.at(0).logprobs, kF32Tolerance,
              "f32 from disk vs cold");
  absl::StatusOr<std::string> metrics = HttpGet(second->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(MetricValue(*metrics, "prefixd_disk_cache_hit_tokens_total"), 63);
  EXPECT_EQ(MetricValue(*metrics, "prefixd_disk_cache_corrupt_blocks_total"), 0);
}

}  // namespace
}  // namespace prefixd::testing
