// SIGHUP, SIGUSR1/2 and the TLS files against the real prefixd binary: tokens and the TLS
// certificate reload without dropping connections, a broken file keeps what was in use, a
// bad certificate or key is refused at start-up before the model loads.
#include <signal.h>

#include <fstream>
#include <sstream>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A self-signed certificate for 127.0.0.1 and its key, made with the openssl CLI.
void MakeCert(const std::string& cert, const std::string& key, const std::string& cn) {
  CommandResult gen = RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                                  "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out",
                                  cert, "-days", "1", "-subj", "/CN=" + cn, "-addext",
                                  "subjectAltName=DNS:localhost,IP:127.0.0.1"});
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& ca) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadAll(ca);
  return grpc::CreateChannel(address, grpc::SslCredentials(ssl));
}

grpc::StatusCode ModelInfoCode(v1::Inference::Stub& stub, const std::string& token) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ModelInfo info;
  return stub.GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).error_code();
}

class ReloadTest : public TinyModelSuite {};

TEST_F(ReloadTest, SighupReloadsTokensAndKeepsThemWhenTheFileIsBroken) {
  TempDir dir;
  const std::string tokens = dir.path() + "/tokens";
  std::ofstream(tokens) << "tok-a alice\n";
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--auth-tokens", tokens});
  ASSERT_TRUE(server.ok()) << server.status();
  Process& proc = (*server)->process();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->address()));
  EXPECT_EQ(ModelInfoCode(*stub, "tok-a"), grpc::StatusCode::OK);
  EXPECT_EQ(ModelInfoCode(*stub, "tok-b"), grpc::StatusCode::UNAUTHENTICATED);

  std::ofstream(tokens) << "tok-b bob\n";
  const absl::Time sent = absl::Now();
  proc.Signal(SIGHUP);
  EXPECT_TRUE(PollUntil(
      [&] {
        return ModelInfoCode(*stub, "tok-b") == grpc::StatusCode::OK &&
               ModelInfoCode(*stub, "tok-a") == grpc::StatusCode::UNAUTHENTICATED;
      },
      absl::Seconds(2)))
      << proc.Output();
  EXPECT_LT(absl::Now() - sent, absl::Seconds(2));
  EXPECT_TRUE(proc.WaitForLine("reload: 1 bearer tokens from " + tokens, absl::Seconds(30)));

  // A file that does not parse keeps the tokens in use, and the log says why.
  std::ofstream(tokens) << "tok-c carol admin extra\n";
  proc.Signal(SIGHUP);
  EXPECT_TRUE(proc.WaitForLine("reload: keeping the previous tokens: " + tokens +
                                   ": auth tokens "
                                   "line 1: unknown field \"extra\"",
                               absl::Seconds(30)))
      << proc.Output();
  EXPECT_EQ(ModelInfoCode(*stub, "tok-b"), grpc::StatusCode::OK);
  EXPECT_EQ(ModelInfoCode(*stub, "tok-c"), grpc::StatusCode::UNAUTHENTICATED);

  // SIGUSR1 and SIGUSR2 are ignored: the server goes on serving.
  proc.Signal(SIGUSR1);
  proc.Signal(SIGUSR2);
  EXPECT_TRUE(proc.WaitForLine("SIGUSR1 ignored", absl::Seconds(30)));
  EXPECT_TRUE(proc.WaitForLine("SIGUSR2 ignored", absl::Seconds(30)));
  EXPECT_EQ(proc.Wait(absl::Milliseconds(200)), std::nullopt);
  EXPECT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 2), "tok-b").status.ok());
}

TEST_F(ReloadTest, SighupSwapsTheTlsCertificateWithoutDroppingConnections) {
  TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const std::string ca1 = dir.path() + "/ca1.pem", ca2 = dir.path() + "/ca2.pem";
  MakeCert(cert, key, "first");
  std::ofstream(ca1) << ReadAll(cert);
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--tls-cert", cert, "--tls-key", key});
  ASSERT_TRUE(server.ok()) << server.status();
  Process& proc = (*server)->process();
  const std::string address = (*server)->address();
  // A connection open across the reload: it trusts only the first certificate, so if the
  // server dropped it, reconnecting would fail the calls made after the reload.
  auto old_conn = v1::Inference::NewStub(TlsChannel(address, ca1));
  ASSERT_EQ(ModelInfoCode(*old_conn, ""), grpc::StatusCode::OK);

  MakeCert(cert, key, "second");
  std::ofstream(ca2) << ReadAll(cert);
  proc.Signal(SIGHUP);
  ASSERT_TRUE(proc.WaitForLine("reload: TLS certificate", absl::Seconds(30))) << proc.Output();
  // New connections get the second certificate within ~1 s.
  EXPECT_TRUE(PollUntil(
      [&] {
        auto fresh = v1::Inference::NewStub(TlsChannel(address, ca2));
        return ModelInfoCode(*fresh, "") == grpc::StatusCode::OK;
      },
      absl::Seconds(30)));
  auto stale = v1::Inference::NewStub(TlsChannel(address, ca1));
  EXPECT_EQ(ModelInfoCode(*stale, ""), grpc::StatusCode::UNAVAILABLE) << "old certificate";
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(Generate(*old_conn, IdsRequest({1, 2, 3}, 4)).status.ok()) << "connection kept";
  }

  // A broken certificate file keeps the pair in use, and the log says what is wrong.
  std::ofstream(cert) << "not a certificate\n";
  proc.Signal(SIGHUP);
  EXPECT_TRUE(proc.WaitForLine("reload: keeping the previous TLS certificate and key: --tls-cert " +
                                   cert + ": no PEM certificate in it",
                               absl::Seconds(30)))
      << proc.Output();
  absl::SleepFor(absl::Milliseconds(1500));  // past the watcher's refresh
  auto after = v1::Inference::NewStub(TlsChannel(address, ca2));
  EXPECT_EQ(ModelInfoCode(*after, ""), grpc::StatusCode::OK);
}

TEST_F(ReloadTest, BadTlsFilesAreNamedBeforeTheModelLoads) {
  TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const std::string cert2 = dir.path() + "/cert2.pem", key2 = dir.path() + "/key2.pem";
  MakeCert(cert, key, "one");
  MakeCert(cert2, key2, "two");
  const std::string garbage = dir.path() + "/garbage.pem";
  std::ofstream(garbage) << "hello\n";
  const std::string prefixd = BuiltBinary("server/prefixd");
  auto run = [&](const std::string& c, const std::string& k) {
    return RunCommand({prefixd, "--model", model_, "--device", "cpu", "--listen", "127.0.0.1:0",
                       "--metrics-listen", "off", "--http-listen", "off", "--tls-cert", c,
                       "--tls-key", k});
  };
  CommandResult r = run(garbage, key);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--tls-cert " + garbage + ": no PEM certificate in it"));
  EXPECT_THAT(r.output, Not(HasSubstr(" layers, ")));  // refused before the model loaded
  r = run(cert, garbage);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--tls-key " + garbage + ": no readable PEM private key"));
  r = run(cert, key2);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr("--tls-key " + key2 +
                        " is not the private key of the certificate in --tls-cert " + cert));
  EXPECT_THAT(r.output, Not(HasSubstr("cannot listen")));
  EXPECT_THAT(r.output, Not(HasSubstr(" layers, ")));
}

}  // namespace
}  // namespace prefixd::testing
