// TLS and bearer tokens against a real prefixd: tenants from --auth-tokens, a self-signed
// certificate made at test time with the openssl CLI.
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class SecureServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const absl::Status prepared = suite_.Prepare();
    ASSERT_TRUE(prepared.ok()) << prepared;
    cert_ = suite_.dir() + "/cert.pem";
    const std::string key = suite_.dir() + "/key.pem";
    CommandResult gen = RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                                    "-out", cert_, "-days", "1", "-subj", "/CN=localhost",
                                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"});
    ASSERT_EQ(gen.exit_code, 0) << gen.output;
    const std::string tokens = suite_.dir() + "/tokens";
    std::ofstream(tokens) << "# token tenant [admin]\ntok-alice alice admin\ntok-bob bob\n";
    const absl::Status s = suite_.Start({"--kv-cache-bytes=4194304", "--tls-cert", cert_,
                                         "--tls-key", key, "--auth-tokens", tokens});
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() { suite_.Stop(); }
  void SetUp() override {
    ASSERT_NE(suite_.server(), nullptr);
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadAll(cert_);
    channel_ = grpc::CreateChannel(suite_.server()->address(), grpc::SslCredentials(ssl));
    stub_ = v1::Inference::NewStub(channel_);
  }

  static inline SuiteServer suite_;
  static inline std::string cert_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(SecureServerTest, EveryInferenceCallNeedsAKnownToken) {
  const v1::GenerateRequest req = IdsRequest({1, 2, 3}, 2);
  EXPECT_EQ(Generate(*stub_, req).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(*stub_, req, "tok-eve").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(*stub_, req, "tok-alic").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Generate(*stub_, req, "tok-alice").status.ok());

  grpc::ClientContext ctx;
  v1::ModelInfo info;
  EXPECT_EQ(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx2;
  ctx2.AddMetadata("authorization", "Bearer tok-bob");
  EXPECT_TRUE(stub_->GetModelInfo(&ctx2, v1::GetModelInfoRequest(), &info).ok());
}

TEST_F(SecureServerTest, PoolWideStatisticsOnlyForAdmins) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer tok-bob");
  v1::CacheStats stats;
  const grpc::Status bob = stub_->GetCacheStats(&ctx, v1::GetCacheStatsRequest(), &stats);
  EXPECT_EQ(bob.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(bob.error_message(), ::testing::HasSubstr("tenant \"bob\" is not marked admin"));
  grpc::ClientContext ctx2;
  ctx2.AddMetadata("authorization", "Bearer tok-alice");
  EXPECT_TRUE(stub_->GetCacheStats(&ctx2, v1::GetCacheStatsRequest(), &stats).ok());
  EXPECT_GT(stats.blocks_total(), 0u);
  grpc::ClientContext ctx3;
  EXPECT_EQ(stub_->GetCacheStats(&ctx3, v1::GetCacheStatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecureServerTest, HealthNeedsNoToken) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(SecureServerTest, TenantsNeverShareCachedBlocks) {
  const std::vector<uint32_t> prompt = RandomIds(9, 48);
  GenerateResult alice1 = Generate(*stub_, IdsRequest(prompt, 3), "tok-alice");
  ASSERT_TRUE(alice1.status.ok());
  EXPECT_EQ(alice1.usage.cached_prompt_tokens(), 0u);
  GenerateResult bob = Generate(*stub_, IdsRequest(prompt, 3), "tok-bob");
  ASSERT_TRUE(bob.status.ok());
  EXPECT_EQ(bob.usage.cached_prompt_tokens(), 0u) << "another tenant";
  // Bob cannot reach Alice's namespace through a salt either.
  v1::GenerateRequest salted = IdsRequest(prompt, 3);
  salted.set_cache_salt("alice");
  EXPECT_EQ(Generate(*stub_, salted, "tok-bob").usage.cached_prompt_tokens(), 0u);
  GenerateResult alice2 = Generate(*stub_, IdsRequest(prompt, 3), "tok-alice");
  EXPECT_EQ(alice2.usage.cached_prompt_tokens(), 47u);
  EXPECT_EQ(alice2.samples[0].token_ids, alice1.samples[0].token_ids);
  EXPECT_EQ(bob.samples[0].token_ids, alice1.samples[0].token_ids) << "same model, same output";
}

TEST_F(SecureServerTest, PlaintextClientsCannotConnect) {
  auto plain = v1::Inference::NewStub(InsecureChannel(suite_.server()->address()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer tok-alice");
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));  // fails fast
  v1::ModelInfo info;
  EXPECT_EQ(plain->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace prefixd::testing
